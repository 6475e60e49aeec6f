import numpy as np
import pytest

from edp_nlu.models import label_names


@pytest.mark.parametrize("label, words", [
    ("B-fromloc.city_name", ["from", "location", "city", "name"]),
    ("I-playlist_owner", ["playlist", "owner"]),
    ("B-timeRange", ["time", "range"]),
    ("AddToPlaylist", ["add", "to", "playlist"]),
    ("atis_flight#atis_airfare", ["flight", "airfare"]),
    ("B-HTTPServer", ["http", "server"]),
    ("room2_type", ["room", "2", "type"]),
    # other scripts keep whole words (an ASCII-only split read "città" as "citt")
    ("B-città_nome", ["città", "nome"]),
    ("I-StraßenName", ["straßen", "name"]),
    ("O", []),
    ("[UNK]", []),
])
def test_label_words_read_the_schemas_names(label, words):
    assert label_names.label_words(label) == words


def test_spans_of_bio_tags():
    assert [label_names.span_of(t) for t in ("O", "B-x", "I-x")] == [
        label_names.OUTSIDE, label_names.BEGIN, label_names.INSIDE]


def test_word_vector_matrix_is_the_mean_of_the_known_words():
    words = ("city", "name", "from")
    vectors = np.array([[1.0, 0.0], [0.0, 2.0], [4.0, 4.0]], np.float32)
    matrix, unknown = label_names.word_vector_matrix(
        ["O", "B-city_name", "B-zzz_qqq", "B-fromloc"], words, vectors)
    np.testing.assert_allclose(matrix, [[0, 0], [0.5, 1.0], [0, 0], [4, 4]])
    assert unknown == ["B-zzz_qqq"]  # "O" has no name to miss


def test_reduced_keeps_the_names_geometry_in_fewer_dimensions():
    rng = np.random.default_rng(0)
    low_rank = rng.normal(size=(9, 2)) @ rng.normal(size=(2, 40))  # rank 2 in 40 dimensions
    reduced = label_names.reduced(low_rank, 4)
    assert reduced.shape == (9, 4)
    # inner products between labels are what the head scores with: kept exactly at rank 2
    np.testing.assert_allclose(reduced @ reduced.T, low_rank @ low_rank.T, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(reduced[:, 2:], 0.0, atol=1e-4)
    assert label_names.reduced(np.ones((3, 2)), 5).shape == (3, 5)  # padded


def test_word_count_matrix_gives_each_name_word_its_own_dimension():
    matrix, words = label_names.word_count_matrix(
        ["O", "B-fromloc.city_name", "I-toloc.city_name", "B-stoploc.airport_code",
         "B-arrive_time.start_time"])
    assert words == sorted(set(words)) and len(words) == 11
    col = {w: i for i, w in enumerate(words)}
    assert not matrix[0].any()  # "O" has no name
    # a composed name is exactly the sum of its words: from and to differ in one dimension
    assert matrix[1, col["from"]] == 1 and matrix[1, col["to"]] == 0
    np.testing.assert_array_equal(matrix[1] - matrix[2], np.eye(11)[col["from"]] -
                                  np.eye(11)[col["to"]])
    assert matrix[3, col["location"]] == matrix[1, col["location"]] == 1  # shared with the rare
    assert matrix[4, col["time"]] == 2  # counted
    np.testing.assert_allclose(np.linalg.norm(label_names.unit_rows(matrix)[1:], axis=1), 1.0)
