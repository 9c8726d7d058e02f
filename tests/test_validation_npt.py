"""The NPT validation part (validation/npt.py): LAMMPS is optional, and its absence is
reported with a message, not raised."""

from __future__ import annotations

import sys

from validation import npt


def test_missing_lammps_is_reported_with_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "lammps", None)      # `import lammps` raises ImportError
    ok, why = npt.lammps_available()
    assert not ok
    assert "not installed" in why and "install_peers.sh" in why


def test_the_quick_configuration_skips_lammps_and_the_full_one_has_three_points():
    quick, full = npt._config(True), npt._config(False)
    assert not quick["lammps"] and len(quick["points"]) == 1
    assert full["lammps"] and len(full["points"]) == 3
