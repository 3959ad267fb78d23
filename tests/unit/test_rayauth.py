"""collect/ray/rayauth.py: the token-auth decision before connecting to a Ray cluster (no Ray needed)."""

import os

from hangtrace.tracer.collect.ray import rayauth as A


def test_explicit_mode_is_respected(tmp_path):
    p = A.plan("10.0.0.1:6379", env={"RAY_AUTH_MODE": "disabled", "HOME": str(tmp_path)})
    assert p.mode == "disabled" and p.env == {} and "RAY_AUTH_MODE=disabled is set" in p.why


def test_token_file_switches_token_mode_on_for_an_explicit_address(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text("x" * 32)
    p = A.plan("10.255.255.1:6379", env={"HOME": str(tmp_path)})
    assert p.mode == "token" and p.env == {"RAY_AUTH_MODE": "token"}
    assert p.token_from == os.path.join(str(tmp_path), ".ray", "auth_token")
    # 'auto': Ray does it itself, nothing is set
    assert A.plan("auto", env={"HOME": str(tmp_path)}).env == {}


def test_token_sources_in_rays_order(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    f = tmp_path / "tok"
    f.write_text("t")
    assert A.token_source({"RAY_AUTH_TOKEN": "abc", "RAY_AUTH_TOKEN_PATH": str(f)}) == "RAY_AUTH_TOKEN"
    assert A.token_source({"RAY_AUTH_TOKEN_PATH": str(f)}) == str(f)
    assert A.token_source({"RAY_AUTH_TOKEN_PATH": str(tmp_path / "missing")}) is None
    assert A.token_source({}) is None  # no ~/.ray/auth_token under this HOME


def test_no_token_remedy_names_every_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    p = A.plan("10.255.255.1:6379", env={"HOME": str(tmp_path)})
    assert p.mode is None and p.env == {}
    r = A.connect_remedy(p, tcp_ok=True)
    assert "RAY_AUTH_MODE=token" in r and "RAY_AUTH_TOKEN=" in r and "RAY_AUTH_TOKEN_PATH=" in r
    assert "the port answers" in r
    r = A.connect_remedy(p, tcp_ok=False)
    assert "nothing listens at 10.255.255.1:6379" in r and "RAY_ADDRESS" in r
    t = A.connect_remedy(A.AuthPlan("h:1", "token", "x", {}, "RAY_AUTH_TOKEN"), tcp_ok=True)
    assert "RAY_AUTH_MODE=disabled" in t and "token from RAY_AUTH_TOKEN" in t
