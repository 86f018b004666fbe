"""Every local Ray cluster the project, its tests and benches start advertises loopback only
(DEVELOPERS.md: bind only to 127.0.0.1): each `ray.init(address="local", ...)` names
`_node_ip_address="127.0.0.1"`."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _local_ray_inits(path: Path) -> list[ast.Call]:
    calls = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if not isinstance(node, ast.Call):
            continue
        named = isinstance(node.func, ast.Name) and node.func.id == "init"  # ray_connect's seam: init = ray.init
        if named or (isinstance(node.func, ast.Attribute) and node.func.attr == "init"):
            if named or (isinstance(node.func.value, ast.Name) and node.func.value.id == "ray"):
                kwargs = {k.arg: k.value for k in node.keywords if k.arg}
                address = kwargs.get("address")
                if address is None or (isinstance(address, ast.Constant) and address.value == "local"):
                    calls.append(node)
    return calls


def test_every_local_ray_init_advertises_loopback():
    files = [p for folder in ("reproduction", "tests", "bench") for p in sorted((REPO / folder).rglob("*.py"))]
    found, bad = 0, []
    for path in files:
        for call in _local_ray_inits(path):
            found += 1
            ip = {k.arg: k.value for k in call.keywords}.get("_node_ip_address")
            if not (isinstance(ip, ast.Constant) and ip.value == "127.0.0.1"):
                bad.append(f"{path.relative_to(REPO)}:{call.lineno}")
    assert found >= 2, f"expected ray_connect's and the tests' local ray.init calls, found {found}"
    assert not bad, f"ray.init without _node_ip_address='127.0.0.1': {bad}"


def test_every_ray_start_and_connect_in_reproduction_goes_through_ray_connect():
    """One bounded helper (reproduction/train/ray_connect.py) starts and joins Ray; nothing else calls ray.init."""
    callers = []
    for path in sorted((REPO / "reproduction").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            func = getattr(node, "func", None)
            if isinstance(node, ast.Call) and isinstance(func, ast.Attribute) and func.attr == "init":
                if isinstance(func.value, ast.Name) and func.value.id == "ray":
                    callers.append(path.relative_to(REPO).as_posix())
    assert callers == [], f"ray.init called outside the helper: {callers}"
    text = (REPO / "reproduction" / "train" / "ray_connect.py").read_text()
    assert "init = init or ray.init" in text and "(init or ray.init)(address=address" in text
