"""``status``, ``hold`` and ``release`` find the service's socket without building the site
(``config.api_socket``), and a site file that is missing or bad is still the error every
command gives for it, the same lines and exit code as ``validate``'s.

Defect this guards against (``bench/cli_start.py``): the three loaded and checked the whole
site file, every pydantic model of it, only to learn the socket's path: 150 ms of a command
meant to answer at once.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.sites import EXAMPLES, write_site
from upsguard.cli import main
from upsguard.config.api_socket import DEFAULT_SOCKET, SERVICE_KEYS, SITE_KEYS, named_socket
from upsguard.config.loading import load_site
from upsguard.config.service import ServiceConfig
from upsguard.config.site import SiteConfig

SITE = """\
site: hq
journal: {tmp}/journal.sqlite
ups:
  - {{name: ups1, simulated: {{}}}}
platforms:
  sim: {{type: simulated}}
resources:
  - {{id: h1, kind: host, platform: sim}}
"""


def test_the_keys_and_default_are_the_models_own() -> None:
    assert set(SiteConfig.model_fields) == SITE_KEYS
    assert set(ServiceConfig.model_fields) == SERVICE_KEYS
    assert not any(f.alias for f in SiteConfig.model_fields.values())
    assert not any(f.alias for f in ServiceConfig.model_fields.values())
    assert ServiceConfig().socket == DEFAULT_SOCKET


@pytest.mark.parametrize(
    "service",
    [
        "service: {{socket: {tmp}/run/api.sock}}",
        "service: {{socket: run/api.sock}}",  # relative, as the model keeps it
        "service: {{socket_group: upsguard}}",  # the default socket
        "",  # no service section: the default socket
    ],
    ids=["absolute", "relative", "default-in-section", "default"],
)
def test_the_socket_read_plainly_is_the_one_the_site_names(tmp_path: Path, service: str) -> None:
    path = write_site(tmp_path, (SITE + service + "\n").format(tmp=tmp_path))
    assert named_socket(path) == load_site(path).service.socket


@pytest.mark.parametrize("example", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_the_examples_name_their_socket_plainly(example: Path) -> None:
    assert named_socket(example) == load_site(example).service.socket


#: Files whose socket only the whole site can tell, or which are wrong elsewhere.
BAD = {
    "misspelt-socket": SITE + "service: {{sokcet: {tmp}/api.sock}}\n",
    "misspelt-section": SITE + "servce: {{socket: {tmp}/api.sock}}\n",
    "socket-a-number": SITE + "service: {{socket: 5}}\n",
    "socket-a-list": SITE + "service: {{socket: [{tmp}/api.sock]}}\n",
    "service-a-list": SITE + "service: [{tmp}/api.sock]\n",
    "name-too-long": SITE + "service: {{socket: {tmp}/" + "s" * 300 + "}}\n",
    "top-a-list": "- site: hq\n",
    "bad-elsewhere": SITE.replace("kind: host", "kind: hots") + "service: {{socket: {tmp}/a.s}}\n",
}


@pytest.mark.parametrize(
    "text", [t for k, t in BAD.items() if k != "bad-elsewhere"], ids=list(BAD)[:-1]
)
def test_a_socket_not_named_plainly_is_left_to_the_whole_site(tmp_path: Path, text: str) -> None:
    assert named_socket(write_site(tmp_path, text.format(tmp=tmp_path))) is None


def said(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    "command",
    [
        ["status"],
        ["hold", "--reason", "storm"],
        ["release"],
        ["status", "--socket", "/nonexistent/api.sock"],
    ],
    ids=["status", "hold", "release", "status-socket"],
)
@pytest.mark.parametrize("case", [*BAD, "missing", "not-yaml", "not-utf8"])
def test_a_missing_or_bad_site_file_is_the_error_validate_gives(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str], case: str
) -> None:
    path = tmp_path / "site.yaml"
    if case == "not-yaml":
        path.write_text("site: [hq\n")
    elif case == "not-utf8":
        path.write_bytes(b"site: h\xffq\n")
    elif case != "missing":
        path.write_text(BAD[case].format(tmp=tmp_path))

    code, out, err = said([*command, "-c", str(path)], capsys)

    assert (code, out, err) == said(["validate", "-c", str(path)], capsys)
    assert code == 2 and err.startswith("upsguard: ")
