"""fetch's check of bundle.json against the resolved commit (audit62 L10) uses the Hub's paths-info endpoint; a
Hub-compatible server without it (HTTP 404/405/501 there, after the repo and bundle.json were found) still fetches,
with one note, as before the check: every file bundle.json lists is still checked by its sha256."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from reproduction.errors import HubIntegrityError
from reproduction.release import hub
from reproduction.release.hub_transfer import HubSettings


class _HTTPError(Exception):
    def __init__(self, status: int):
        super().__init__(f"HTTP {status}")
        self.response = SimpleNamespace(status_code=status)


class _Api:
    def __init__(self, answer):
        self.answer = answer

    def get_paths_info(self, *args, **kwargs):
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


@pytest.mark.parametrize("status", [404, 405, 501])
def test_a_server_without_paths_info_is_noted_not_refused(status, capsys):
    hub._check_manifest_pinned(_Api(_HTTPError(status)), "a/r", "model", "c" * 40, b"{}", HubSettings(), None)
    err = capsys.readouterr().err
    assert f"paths-info: HTTP {status}" in err and "checked by its sha256" in err


def test_other_bytes_than_the_commit_holds_are_still_refused():
    remote = SimpleNamespace(path="bundle.json", size=2, lfs=None, blob_id=hub._git_sha1(b"[]"))
    with pytest.raises(HubIntegrityError, match="are not the file commit"):
        hub._check_manifest_pinned(_Api([remote]), "a/r", "model", "c" * 40, b"{}", HubSettings(), None)
    hub._check_manifest_pinned(_Api([remote]), "a/r", "model", "c" * 40, b"[]", HubSettings(), None)  # the same
