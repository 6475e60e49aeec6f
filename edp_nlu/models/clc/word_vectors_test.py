import numpy as np
import pytest

from edp_nlu.models.clc import word_vectors


def _write(tmp_path, text):
    path = tmp_path / "vectors.vec"
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_reads_fasttext_header_and_keeps_first_duplicate(tmp_path):
    path = _write(tmp_path, "3 2\nthe 0.5 -1\ncat 1 2\nthe 9 9\n")
    vectors = word_vectors.load_vec_file(path)
    assert vectors.words == ("the", "cat")
    np.testing.assert_array_equal(vectors.vectors, [[0.5, -1.0], [1.0, 2.0]])


def test_reads_glove_text_and_max_words(tmp_path):
    path = _write(tmp_path, "a 1 2 3\nb 4 5 6\nc 7 8 9\n")
    vectors = word_vectors.load_vec_file(path, max_words=2)
    assert vectors.words == ("a", "b") and vectors.dim == 3


@pytest.mark.parametrize(
    "text, message",
    [
        ("a 1 2\nb 1\n", r"vectors.vec:2: 1 values, expected 2"),
        ("a 1 x\n", r"vectors.vec:1: non-numeric"),
    ],
)
def test_malformed_lines_name_file_and_line(tmp_path, text, message):
    with pytest.raises(ValueError, match=message):
        word_vectors.load_vec_file(_write(tmp_path, text))


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="not found"):
        word_vectors.load_vec_file(str(tmp_path / "nope.vec"))


def test_glove_package_vectors():
    vectors = word_vectors.load_word_vectors(word_vectors.GLOVE_6B_50D, max_words=1000)
    assert vectors.dim == 50 and len(vectors.words) == 1000
    assert vectors.words[0] == "the"  # most frequent first
    # Stanford's glove.6B.50d.txt starts with: the 0.418 0.24968 -0.41242 0.1217 0.34527 ...
    np.testing.assert_allclose(
        vectors.vectors[0, :5], [0.418, 0.24968, -0.41242, 0.1217, 0.34527], atol=1e-6
    )


def test_embedding_matrix_uses_vectors_and_lowercase_fallback():
    vectors = word_vectors.WordVectors(("cat", "dog"), np.array([[1, 1], [2, 2]], np.float32))
    matrix, found = word_vectors.embedding_matrix(
        ["[PAD]", "[UNK]", "Cat", "emu"], vectors, 2, seed=0
    )
    assert found == 1
    np.testing.assert_array_equal(matrix[0], [0, 0])
    np.testing.assert_array_equal(matrix[2], [1, 1])
    assert not np.allclose(matrix[3], 0)
