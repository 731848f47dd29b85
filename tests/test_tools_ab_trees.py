"""tools/ab_trees.py: a tree's snapshot, its changed kernels found from its own sources, the overlay of its
cubins on the base ones, and the refusals (no snapshot, no artifact, a bad tree name)."""

import importlib.util
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
spec = importlib.util.spec_from_file_location("ab_trees", ROOT / "tools" / "ab_trees.py")
ab = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ab)


def test_copy_sources_working_tree_and_revision(tmp_path):
    for tree, rev in (("w", None), ("r", "HEAD")):
        (tmp_path / tree).mkdir()
        ab.copy_sources(tmp_path / tree, rev)
    for tree in ("w", "r"):
        for name in ab.SOURCES:
            assert (tmp_path / tree / name).exists(), f"{tree}: {name} not copied"
    assert not list((tmp_path / "w").rglob("__pycache__"))
    with pytest.raises(SystemExit, match="git archive no-such-rev"):
        ab.copy_sources(tmp_path / "r", "no-such-rev")


def test_stale_kernels_come_from_the_trees_own_sources(kernel_builds, tmp_path):
    """Against a base holding one current cubin, only that kernel is current for an unchanged tree; a change
    to its source in the snapshot (not in the installed package) makes it differ."""
    from inferno.kernels.registry import get

    v = get("sample_pick")
    built = Path(kernel_builds([v], [ab.ARCH])) / ab.ARCH  # the session's builds may hold every kernel: copy one
    base = tmp_path / "base"
    (base / ab.ARCH).mkdir(parents=True)
    for ext in (".cubin", ".json"):
        shutil.copy2(built / f"{v.name}{ext}", base / ab.ARCH / f"{v.name}{ext}")
    tree = tmp_path / "t"
    tree.mkdir()
    ab.copy_sources(tree, None)
    stale = ab.stale_in(tree, base)
    assert v.name not in stale and len(stale) > 10
    src = tree / Path(v.source_file).relative_to(ROOT)
    src.write_text(src.read_text() + "\n# changed\n")
    assert v.name in ab.stale_in(tree, base)


def test_kernels_overlay_the_base(tmp_path, monkeypatch):
    monkeypatch.setattr(ab, "AB", tmp_path / "ab")
    base, own = tmp_path / "base" / ab.ARCH, tmp_path / "ab" / "N" / "kernels" / ab.ARCH
    for d in (base, own):
        d.mkdir(parents=True)
    (base / "a.cubin").write_bytes(b"base a")
    (base / "b.cubin").write_bytes(b"base b")
    (own / "b.cubin").write_bytes(b"own b")
    root = ab._kernels_for("N", tmp_path / "base", tmp_path / "work")
    assert (root / ab.ARCH / "a.cubin").read_bytes() == b"base a"
    assert (root / ab.ARCH / "b.cubin").read_bytes() == b"own b"


def test_refusals(tmp_path, monkeypatch):
    monkeypatch.setattr(ab, "AB", tmp_path / "ab")
    with pytest.raises(SystemExit, match="no snapshot for X"):
        ab.main(["bench", "X", "--base", str(tmp_path)])
    with pytest.raises(SystemExit, match="tree name 'a/b'"):
        ab.main(["snapshot", "a/b"])
    with pytest.raises(SystemExit, match="no base cubins"):
        ab.main(["snapshot", "N", "--base", str(tmp_path / "none")])
    (tmp_path / "ab" / "N").mkdir(parents=True)
    (tmp_path / "base" / ab.ARCH).mkdir(parents=True)
    monkeypatch.setattr(ab, "stale_in", lambda tree, base: [])
    with pytest.raises(SystemExit, match="pass --synth MODEL"):
        ab.main(["bench", "N", "--base", str(tmp_path / "base"), "--artifact", str(tmp_path / "none.ninfer")])


def test_summary_of_a_report():
    run = {"decode": {"tok_s": {"median": 200.04}}, "prefill": {"tok_s": {"median": 10500.0}},
           "decode_roofline_ratio": 0.7567}
    assert ab._summary({"runs": [run], "limits": {"copy_gbps": 4270.8}}) == (200.04, "75.67", 10500.0, 4270.8)
    run["decode_roofline_ratio"] = None
    assert ab._summary({"runs": [run], "limits": {}})[1::2] == ("", 0)


def test_machine_of_a_report():
    """The GPU and its SM clock where the tree's bench recorded them; blank for an older tree's report."""
    run = {"clocks": {"sm_mhz": {"median": 1980.0, "min": 1755, "max": 1980}}}
    gpu = {"uuid": "GPU-bc98634b-88ae-e9f1-ad60-f3317469ce49", "sm_mhz_max": 1980, "mem_mhz_max": 3201}
    assert ab._machine({"device": {"gpu": gpu}, "runs": [run]}) == "GPU-bc98634b, 1,980 MHz"
    assert ab._machine({"device": {"gpu": gpu}, "runs": [{"clocks": {"sm_mhz": None}}]}) == "GPU-bc98634b"
    assert ab._machine({"device": {"name": "NVIDIA H200"}, "runs": [{}]}) == ""
