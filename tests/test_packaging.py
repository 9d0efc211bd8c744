"""setup.cfg installs every package of the tree under the pyflow name."""
import configparser
import pathlib

ROOT = pathlib.Path(__file__).parent.parent
MAPPED = {"pyflow": "pyflow", "kernels": "pyflow.kernels", "comm": "pyflow.comm",
          "models": "pyflow.models"}


def test_setup_cfg_lists_every_package():
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    listed = set(cfg["options"]["packages"].split())
    found = set()
    for top, name in MAPPED.items():
        for init in (ROOT / top).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / top).parts
            found.add(".".join((name,) + rel))
    assert found - listed == set(), f"packages missing from setup.cfg: {sorted(found - listed)}"
    assert listed - found == set(), f"setup.cfg lists packages that don't exist: {sorted(listed - found)}"
