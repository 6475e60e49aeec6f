"""The privacy report: epsilon recomputed from the records, every section, both formats."""
import base64
import datetime
import re

import pytest

from edp_tf import accounting, report

RECORDS = [accounting.EpochRecord(t, 10, 1.2, 1.2) for t in range(3)]


def _ledger(**changes):
    epsilon = accounting.compute_epsilon(RECORDS, 0.05, 1e-5)
    return {"delta": 1e-5, "sampling": "poisson", "sampling_rate": 0.05, "dataset_size": 2000,
            "batch_size": 100.0, "replicas": 2, "microbatch_size": 1, "noise_mode": "calibrated",
            "l2_norm_clip": 1.0, "sensitivity": 1, "privacy_unit": "example",
            "epochs": [r.to_dict() for r in RECORDS], "extra_events": [], "epsilon": epsilon,
            "epsilon_pld": epsilon, "epsilon_rdp": epsilon * 1.1, "private": True,
            "assumes": ["n is public"], "not_covered": ["a vocabulary from training text"],
            "artifacts": {"covered": ["privacy.json"], "not_covered": ["tensorboard/"]},
            **changes}


def test_the_html_page_holds_every_section_and_the_recomputed_curve(tmp_path):
    ledger = _ledger()
    path = report.write(ledger, str(tmp_path / "r.html"))
    page = open(path).read()
    for heading in ("The guarantee", "Epsilon over the epochs", "The mechanism",
                    "What epsilon assumes", "What epsilon does not cover", "Each artifact",
                    "Checking the mechanism"):
        assert f"<h2>{heading}</h2>" in page
    assert f"({ledger['epsilon']:.3g}, 1e-05)-differentially private" in page
    assert "NOT covered: tensorboard/" in page and "n is public" in page
    assert "--mechanism=dpsgd" in page  # per-example: the dpsgd audit
    curve = report.epsilon_curve(ledger)
    assert [k for k, _ in curve] == [1, 2, 3]
    assert curve[-1][1] == pytest.approx(ledger["epsilon"])
    assert curve[0][1] < curve[1][1] < curve[2][1]
    assert page.count("<circle") == 3 and "<script" not in page


def test_markdown_embeds_the_plot_and_a_non_private_or_edited_ledger_says_so(tmp_path):
    text = report.render(_ledger(private=False, microbatch_size=4), "md")
    assert "NOT reported as private" in text and "--mechanism=default" in text
    data = re.search(r"data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)\)", text).group(1)
    assert base64.b64decode(data).startswith(b"<svg")
    edited = report.render(_ledger(epsilon=0.5), "md")
    assert "WARNING: privacy.json states epsilon 0.5" in edited
    with pytest.raises(ValueError, match="format"):
        report.render(_ledger(), "pdf")


def test_a_bandmf_statement_says_what_was_charged_and_that_no_audit_exists():
    # 10 steps an epoch with b = 3: ceil(10 / 3) = 4 participations charged per epoch, at 3 q
    records = [accounting.EpochRecord(t, 10, 1.2, 1.2, bands=3) for t in range(3)]
    epsilon = accounting.compute_epsilon(records, 0.05, 1e-5)
    ledger = _ledger(epochs=[r.to_dict() for r in records], bands=3, epsilon=epsilon,
                     epsilon_pld=epsilon)
    sentence = report.sampling_sentence(ledger)
    assert "b = 3 bands" in sentence and "b q = 0.15" in sentence
    assert "12 participations at most" in sentence and "30 steps over 3 epochs" in sentence
    # a reviewer re-deriving epsilon from the printed words: 12 Poisson steps at 0.15
    rederived = accounting.compute_epsilon([accounting.EpochRecord(0, 12, 1.2, 1.2)], 0.15, 1e-5)
    assert rederived == pytest.approx(epsilon, rel=1e-6)
    text = report.render(ledger, "md")
    assert sentence in text and "No audit of BandMF exists yet" in text
    assert "--mechanism=dpsgd" not in text  # not the audit of another mechanism
    assert "BandMF" not in report.sampling_sentence(_ledger())


def test_the_report_says_what_the_ledger_says_with_its_target_version_date_and_audit():
    ledger = _ledger(target_epsilon=3.0)
    page = report.render(ledger, "html")
    assert 'stroke-dasharray="5,4"' in page and "target 3</text>" in page  # the budget line
    assert f"on {datetime.date.today().isoformat()}" in page and "edp-tf " in page
    # the artifact that is not covered is in the not-covered section too, not "(nothing)"
    section = page[page.index("What epsilon does not cover"):page.index("Each artifact")]
    assert "the file tensorboard/" in section and "(nothing)" not in section
    # the audit of this run: its epsilon and its replicas, not the repository's example
    assert f"--target_epsilon={ledger['epsilon']:.3g} --replicas=2" in page
