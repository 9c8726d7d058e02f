"""The validation suite's check records (validation/common.py) and the table that
`simlib validate` prints and the report holds. No validation part runs here: a fake part
returns a Section with one passing and one failing check."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from validation import common  # noqa: E402


def _fake_section() -> common.Section:
    checks = common.Checks("fake")
    assert checks.add("error at t1", 0.5, 10.0, "tol units", 0.5 <= 10.0)
    assert not checks.add("measured order", 3.2, 4.0, "order", 3.2 >= 4.0,
                          "fake: order 3.2 below 4", op=">=")
    # a second failing check sharing the message adds no second failure line
    assert not checks.add("order on another span", 3.1, 4.0, "order", False,
                          "fake: order 3.2 below 4", op=">=")
    return common.Section(title="fake", body="", failures=checks.failures,
                          checks=checks.checks)


def test_checks_record_passing_and_failing():
    section = _fake_section()
    assert section.failures == ["fake: order 3.2 below 4"]
    assert [(c.name, c.passed) for c in section.checks] == [
        ("error at t1", True), ("measured order", False), ("order on another span", False)]
    default = common.Checks("p")
    default.add("drift", 2e-3, 1e-4, "rel", False)
    assert default.failures == ["p: drift: 2.0e-3 rel, allowed <= 1.0e-4"]
    assert common.Section(title="t", body="").checks == []


def test_checks_tables():
    checks = _fake_section().checks
    lines = common.checks_text(checks).splitlines()
    assert lines[0].split() == ["part", "check", "value", "allowed", "unit", "pass"]
    assert set(lines[1].replace(" ", "")) == {"-"}
    assert lines[2].split() == ["fake", "error", "at", "t1", "0.5", "<=", "10", "tol", "units",
                                "yes"]
    assert ">= 4" in lines[3] and lines[3].endswith("FAIL") and "3.2" in lines[3]
    md = common.checks_markdown(checks).splitlines()
    assert md[0] == "| part | check | value | allowed | unit | pass |"
    assert md[3] == "| fake | measured order | 3.2 | >= 4 | order | FAIL |"


def test_cli_validate_prints_checks_and_fails(monkeypatch, tmp_path, capsys):
    from simlib import cli
    from validation import run as vrun

    class FakePart:
        @staticmethod
        def run(quick=False):
            return _fake_section()

    monkeypatch.setattr(vrun, "PARTS", {"fake": FakePart})
    monkeypatch.setattr(common, "FIGURE_DIR", common.FIGURE_DIR)
    report = tmp_path / "report.md"
    status = cli.main(["validate", "--parts", "fake", "--output", str(report)])
    out = capsys.readouterr().out
    assert status == 1
    rows = [line.split() for line in out.splitlines() if line.startswith("fake ")]
    assert ["fake", "measured", "order", "3.2", ">=", "4", "order", "FAIL"] in rows
    assert "checks (3, 2 failed)" in out
    text = report.read_text()
    assert "## Checks" in text
    assert "| fake | error at t1 | 0.5 | <= 10 | tol units | yes |" in text

