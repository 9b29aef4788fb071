"""The doctor's own rules on simulated gear: rows and exit codes, a check that hangs or breaks,
``--only``, the files checks, what broke since the last checkup, and what validate warns of.
The checks of real UPSes, platforms and caches run against the peers
(tests/integration/test_doctor_cluster.py)."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from tests.sites import simple_site, site_from, write_site
from upsguard.cli import main
from upsguard.clock import SystemClock
from upsguard.config.checks_schedule import BatteryTestConfig, parse_at
from upsguard.config.platforms import WolSettings
from upsguard.config.service import NotifySettings
from upsguard.controller.notify import Notifier
from upsguard.doctor.changes import compare
from upsguard.doctor.checkup import BoundedCheck, Selection, run_checkup
from upsguard.doctor.site_files import check_files, journal
from upsguard.events import (
    BatteryTestFinished,
    CheckupDone,
    describe,
    level,
)
from upsguard.findings import Area, Finding, Verdict, fail, ok, warn
from upsguard.journal import Journal
from upsguard.journal.checkups import battery_tests, last_checkup
from upsguard.models import PlatformName, UpsName
from upsguard.plugins.platforms.wol import WolPlatform, gateway_for
from upsguard.selftest import TestState as SelfTest  # not a class of tests for pytest to collect
from upsguard.selftest import from_nut


def test_a_simulated_site_checks_out(tmp_path: Path) -> None:
    site = site_from(tmp_path, {**simple_site(), "journal": str(tmp_path / "j.sqlite")})
    checkup = asyncio.run(run_checkup(site, SystemClock()))
    keys = {(f.area, f.subject, f.check): f for f in checkup.findings}
    assert keys[(Area.UPS, "ups1", "data")].verdict is Verdict.OK
    assert keys[(Area.PLATFORM, "vc", "login")].detail == "connected"
    assert keys[(Area.RESOURCE, "web", "state")].verdict is Verdict.OK
    assert keys[(Area.PLAN, "shutdown", "plan")].detail.endswith("from live inventory")
    assert checkup.exit_code == 0
    # in the order of the site file: UPSes, platforms, resources, then the rest
    areas = [f.area for f in checkup.findings]
    assert areas == sorted(areas, key=list(Area).index)
    resources = [f.subject for f in checkup.findings if f.area is Area.RESOURCE]
    assert resources == sorted(resources, key=[r["id"] for r in simple_site()["resources"]].index)


def test_only_keeps_what_it_names(tmp_path: Path) -> None:
    site = site_from(tmp_path, simple_site())
    only = Selection(frozenset({"ups"}), frozenset({"db"}))
    checkup = asyncio.run(run_checkup(site, SystemClock(), only=only))
    assert {(f.area, f.subject) for f in checkup.findings} == {
        (Area.UPS, "ups1"),
        (Area.PLATFORM, "vc"),
        (Area.RESOURCE, "db"),
    }


def test_a_check_that_hangs_fails_alone_within_its_time() -> None:
    async def hangs() -> list[Finding]:
        await asyncio.Event().wait()
        return []

    async def breaks() -> list[Finding]:
        raise RuntimeError("boom")

    async def scenario() -> tuple[list[Finding], list[Finding], list[Finding]]:
        check = BoundedCheck(asyncio.Semaphore(2), timeout_s=0.5)
        return await asyncio.gather(
            check(Area.PLATFORM, "vc", hangs()),
            check(Area.UPS, "ups1", breaks()),
            check(Area.UPS, "ups2", asyncio.sleep(0, [ok(Area.UPS, "ups2", "data", "fine")])),
        )

    hung, broke, fine = asyncio.run(scenario())
    assert [(f.verdict, f.check, f.detail) for f in hung] == [
        (Verdict.FAIL, "answer", "no answer within 0.5s")
    ]
    assert [(f.verdict, f.detail) for f in broke] == [
        (Verdict.FAIL, "internal error: RuntimeError('boom')")
    ]
    assert [f.verdict for f in fine] == [Verdict.OK] and fine[0].took_s is not None


def test_an_unknown_only_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_site(tmp_path, "site: t\nups: [{name: ups1, simulated: {}}]\n")
    assert main(["doctor", "-c", str(path), "--only", "nope"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("upsguard: --only: no area or entry named nope (areas: cache, file,")


def test_doctor_exits_1_and_names_each_fail(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = simple_site()
    data["journal"] = str(tmp_path / "j.sqlite")
    data["platforms"]["dev"] = {"type": "ipmi", "host": "127.0.0.1", "user": "u",
                                "password_file": str(tmp_path / "gone.pw")}  # fmt: skip
    path = write_site(tmp_path, yaml.safe_dump(data))
    assert main(["doctor", "-c", str(path)]) == 1
    out, err = capsys.readouterr()
    gone = tmp_path / "gone.pw"
    assert err.splitlines() == [
        f"upsguard: FAIL platform dev: login: platform 'dev' password: {gone}: cannot read the "
        "file: No such file or directory -> fix the site file, or the file or variable it names",
        f"upsguard: FAIL file {gone}: readable: platforms.dev.password_file: {gone} does not "
        "exist -> create it (mode 0600 for a secret), or fix the path in the site file",
    ]
    assert out.splitlines()[-1].startswith("doctor: ")


def test_files_missing_world_readable_and_fine(tmp_path: Path) -> None:
    secret, shared, ca = tmp_path / "pw", tmp_path / "shared.pw", tmp_path / "ca.pem"
    secret.write_text("x\n")
    secret.chmod(0o600)
    shared.write_text("x\n")
    shared.chmod(0o644)
    ca.write_text("cert\n")
    ca.chmod(0o644)
    site = site_from(
        tmp_path,
        {
            "site": "t",
            "ups": [
                {"name": "a", "nut": {"ups": "a", "user": "u", "password_file": str(secret)}},
                {"name": "b", "nut": {"ups": "b", "user": "u", "password_file": str(shared),
                                      "starttls": True, "ca_file": str(ca)}},
                {"name": "c", "nut": {"ups": "c", "user": "u", "password_file": str(secret)}},
                {"name": "d", "nut": {"ups": "d", "user": "u",
                                      "password_file": str(tmp_path / "gone")}},
            ],
        },
    )  # fmt: skip
    found = {f.subject: f for f in check_files(site)}
    assert len(found) == 4  # one row per file, however often the site names it
    assert found[str(secret)].verdict is Verdict.OK
    assert found[str(shared)].verdict is Verdict.WARN
    assert found[str(shared)].fix == f"chmod o-rwx {shared}"
    assert found[str(ca)].detail == "ups[1].nut.ca_file: readable"  # no secret: may be shared
    assert found[str(tmp_path / "gone")].verdict is Verdict.FAIL


def test_the_journal_is_never_made_by_the_check(tmp_path: Path) -> None:
    site = site_from(tmp_path, {**simple_site(), "journal": str(tmp_path / "new" / "j.sqlite")})
    (row,) = journal(site)
    assert (row.verdict, row.detail) == (Verdict.OK, f"not there yet; {tmp_path} lets it be made")
    assert not (tmp_path / "new").exists()


def test_validate_warns_of_each_file_it_cannot_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = (
        "site: t\n"
        "ups:\n"
        "  - name: ups1\n"
        f"    nut: {{ups: cp, user: mon, password_file: {tmp_path}/nut.pw}}\n"
    )
    path = write_site(tmp_path, text)
    assert main(["validate", "-c", str(path)]) == 0
    (warning,) = capsys.readouterr().err.splitlines()
    assert warning == (
        f"upsguard: warning: ups[0].nut.password_file: {tmp_path}/nut.pw does not exist: create "
        f"it (readable by upsguard's user), or fix the path ({path}:4)"
    )


def _f(check: str, verdict: Verdict) -> Finding:
    if verdict is Verdict.OK:
        return ok(Area.UPS, "ups1", check, "fine")
    return (warn if verdict is Verdict.WARN else fail)(Area.UPS, "ups1", check, "bad", "fix it")


def test_what_broke_and_what_was_mended() -> None:
    before = [_f("login", Verdict.OK), _f("data", Verdict.WARN), _f("rights", Verdict.FAIL)]
    now = [
        _f("login", Verdict.FAIL),  # broke
        _f("data", Verdict.FAIL),  # worse: broke
        _f("rights", Verdict.OK),  # mended
        _f("commands", Verdict.WARN),  # new and wrong: broke
    ]
    broke, mended = compare(before, now)
    assert [f.check for f in broke] == ["login", "data", "commands"]
    assert [f.check for f in mended] == ["rights"]
    assert compare(now, now) == ((), ())
    assert [f.check for f in compare(None, now)[0]] == ["login", "data", "commands"]


def test_checkup_and_battery_test_lines_and_levels() -> None:
    at = datetime(2026, 11, 1, 3, 0, tzinfo=UTC)
    broke = _f("login", Verdict.FAIL)
    done = CheckupDone(at, (broke, _f("data", Verdict.OK)), broke=(broke,))
    assert describe(done) == (
        "checks: 1 ok, 0 warn, 1 fail; broke since the last checkup: ups ups1 login fail: bad"
    )
    assert level(done) == "warning"
    assert level(CheckupDone(at, (_f("data", Verdict.OK),))) == "info"
    test = BatteryTestFinished(at, UpsName("ups1"), "deep", at, SelfTest.PASSED, "Done and passed",
                               100.0, 80.0, 3000.0)  # fmt: skip
    assert describe(test) == (
        "UPS ups1: deep battery test passed (Done and passed), runtime observed 50 min"
    )
    assert level(test) == "info"
    failed = BatteryTestFinished(
        at, UpsName("ups1"), "quick", at, SelfTest.FAILED, "Done and error"
    )
    assert level(failed) == "warning"


@pytest.mark.parametrize(
    ("text", "state"),
    [
        ("Done and passed", SelfTest.PASSED),
        ("In progress", SelfTest.RUNNING),
        ("Done and warning", SelfTest.WARNING),
        ("Done and error", SelfTest.FAILED),
        ("Aborted by user", SelfTest.ABORTED),
        ("No test initiated", SelfTest.NONE),
        ("", SelfTest.NONE),
        ("Giving up", SelfTest.UNKNOWN),
    ],
)
def test_nut_test_results(text: str, state: SelfTest) -> None:
    assert from_nut(text).state is state


def test_battery_test_times() -> None:
    assert parse_at("Sun 03:00").day == "sun" and parse_at("sunday 3:05").minute == 5
    assert parse_at("03:00").day is None
    with pytest.raises(ValueError, match="'Sun 25:00': the hour is 0 to 23"):
        parse_at("Sun 25:00")
    with pytest.raises(ValueError, match="is not a time like 'Sun 03:00'"):
        parse_at("Sunday noon")
    with pytest.raises(ValueError, match="wears the battery: at most one a day"):
        BatteryTestConfig.model_validate({"every": "1h"})
    test = BatteryTestConfig.model_validate({"every": "30d", "kind": "deep"})
    assert test.command == "test.battery.start.deep"


def test_the_journal_keeps_checkups_and_battery_tests(tmp_path: Path) -> None:
    at = datetime(2026, 11, 1, 3, 0, tzinfo=UTC)
    rights = fail(Area.UPS, "ups1", "rights", "refused", "grant it", missing=("instcmds", "set"))
    findings = (ok(Area.UPS, "ups1", "login", "fine"), rights.timed(0.25))
    journal = Journal(tmp_path / "j.sqlite")
    try:
        assert last_checkup(journal.db) is None
        journal.write.record(CheckupDone(at, findings, broke=(rights,), took_s=1.5))
        journal.write.record(
            BatteryTestFinished(
                at, UpsName("ups1"), "quick", at, SelfTest.PASSED, "Done and passed"
            )
        )
        when, back = last_checkup(journal.db) or (None, [])
        assert when == at and tuple(back) == findings
        (test,) = battery_tests(journal.db, "ups1")
        assert (test.kind, test.state, test.text) == (
            "quick",
            SelfTest.PASSED,
            "Done and passed",
        )
        (line,) = [e.text for e in journal.read.events() if e.kind == "CheckupDone"]
        assert line == (
            "checks: 1 ok, 0 warn, 1 fail; broke since the last checkup: "
            "ups ups1 rights fail: refused"
        )
    finally:
        journal.close()


def test_notify_test_runs_the_hook_and_says_what_it_answered(tmp_path: Path) -> None:
    got = tmp_path / "got.json"
    good = NotifySettings.model_validate({"command": ["/bin/sh", "-c", f"cat > {got}"]})
    (sent,) = asyncio.run(Notifier(good, "lab").test())
    assert (sent.subject, sent.verdict) == ("command", Verdict.OK)
    assert '"event": "Test"' in got.read_text()
    bad = NotifySettings.model_validate({"command": ["/bin/sh", "-c", "echo nope >&2; exit 3"]})
    (refused,) = asyncio.run(Notifier(bad, "lab").test())
    assert (refused.verdict, refused.detail) == (
        Verdict.FAIL,
        "notify command /bin/sh: exit 3: nope",
    )
    (nothing,) = asyncio.run(Notifier(NotifySettings(), "lab").test())
    assert nothing.verdict is Verdict.WARN


# -- rows that said something else than what was wrong --------------------------------------
#
# Defects these reproduce (each failed before its fix): a missing SSH key file was "cannot
# connect: No such file or directory -> check ... that its SSH server runs"; the Wake-on-LAN
# path was "ok" for a broadcast address reached only through the default gateway, where a
# router drops a directed broadcast and no machine wakes.


def test_a_missing_ssh_key_file_is_said_as_such_with_its_fix(tmp_path: Path) -> None:
    key = tmp_path / "id_ed25519"
    data = simple_site()
    data["platforms"]["nas-ssh"] = {"type": "ssh", "user": "admin", "key_file": str(key)}
    data["resources"].append(
        {"id": "nas2", "kind": "storage", "platform": "nas-ssh", "host": "127.0.0.1",
         "shutdown": "poweroff"}
    )  # fmt: skip
    site = site_from(tmp_path, data)

    checkup = asyncio.run(
        run_checkup(site, SystemClock(), only=Selection(names=frozenset({"nas2"})))
    )

    (row,) = [f for f in checkup.findings if (f.subject, f.check) == ("nas2", "ssh")]
    assert row.verdict is Verdict.FAIL
    assert f"private key {key}" in row.detail and "No such file or directory" in row.detail
    assert "cannot connect" not in row.detail
    assert "SSH server" not in row.fix
    assert f"ssh-keygen -t ed25519 -N '' -f {key}" in row.fix
    assert "authorized_keys" in row.fix


#: /proc/net/route of a machine on 192.0.2.0/24 whose default gateway is 192.0.2.1.
ROUTES = (
    "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"
    "eth0\t00000000\t010200C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n"
    "eth0\t000200C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n"
)


def wol(tmp_path: Path, broadcast: str) -> WolPlatform:
    routes = tmp_path / "route"
    routes.write_text(ROUTES)
    settings = WolSettings.model_validate({"type": "wol", "broadcast": broadcast})
    return WolPlatform(PlatformName("wake"), settings, SystemClock(), routes=routes)


def test_wake_on_lan_through_the_default_gateway_is_not_ok(tmp_path: Path) -> None:
    (row,) = asyncio.run(wol(tmp_path, "192.168.1.255").diagnose([]))

    assert row.verdict is Verdict.WARN
    assert "through the gateway 192.0.2.1" in row.detail
    assert "192.168.1.255:9" in row.detail
    assert "broadcast address of the machines' network" in row.fix


def test_wake_on_lan_on_a_network_of_this_machine_is_ok(tmp_path: Path) -> None:
    (row,) = asyncio.run(wol(tmp_path, "127.255.255.255").diagnose([]))

    assert row.verdict is Verdict.OK
    assert row.detail == "packets to 127.255.255.255:9 go out on a network of this machine"


@pytest.mark.parametrize(
    ("address", "gateway"),
    [
        ("192.168.1.255", "192.0.2.1"),
        ("192.0.2.255", None),
        ("127.0.0.1", None),
        ("255.255.255.255", None),
    ],
)
def test_the_gateway_a_broadcast_would_leave_through(address: str, gateway: str | None) -> None:
    assert gateway_for(address, ROUTES) == gateway


@pytest.mark.parametrize(
    ("trusted", "verdict"),
    [(["127.0.0.1"], Verdict.WARN), (["::1"], Verdict.WARN), (["0.0.0.0/0"], Verdict.WARN),
     (["10.0.0.5", "fd00::/8"], Verdict.OK)],
)  # fmt: skip
def test_doctor_warns_of_a_trusted_proxy_on_loopback(
    tmp_path: Path, trusted: list[str], verdict: Verdict
) -> None:
    secret = tmp_path / "proxy.secret"
    secret.write_text("s" * 32)
    secret.chmod(0o600)
    web = {
        "users": [{"name": "ana", "role": "operator"}],
        "proxy": {"trusted": trusted, "secret_file": str(secret)},
    }
    site = site_from(tmp_path, {**simple_site(), "web": web})
    checkup = asyncio.run(run_checkup(site, SystemClock(), only=Selection(frozenset({"web"}))))
    (row,) = checkup.findings
    assert (row.area, row.subject, row.check) == (Area.WEB, "proxy", "address")
    assert row.verdict is verdict
    if verdict is Verdict.WARN:
        assert "every local process connects from it" in row.detail
        assert row.fix.startswith(f"keep {secret} readable by upsguard's user only (mode 0600")


def test_doctor_checks_each_apprise_channel_by_name_and_never_shows_its_url(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    secret = "Xq2-chat-SECRET"
    good, bad = tmp_path / "mail.url", tmp_path / "chat.url"
    good.write_text("mailtos://ups:pw@mail.example.org?to=ops@example.org\n")
    bad.write_text(f"nosuchservice://{secret}@chat.example.org/room\n")
    for path in (good, bad):
        path.chmod(0o600)
    data = simple_site()
    data["journal"] = str(tmp_path / "j.sqlite")
    data["service"] = {
        "notify": {
            "apprise": [
                {"name": "ops-mail", "url_file": str(good)},
                {"name": "ops-chat", "url_file": str(bad), "min_level": "warning"},
            ]
        }
    }
    path = write_site(tmp_path, yaml.safe_dump(data))
    assert main(["doctor", "-c", str(path), "--only", "notify", "--format", "json"]) == 1
    out, err = capsys.readouterr()
    assert err.splitlines() == [
        "upsguard: FAIL notify ops-chat: url: Apprise does not understand the URL "
        "(nosuchservice://…) -> check the URL against Apprise's documentation of that service"
    ]
    said = {f["subject"]: f["detail"] for f in json.loads(out)["findings"]}
    assert said["ops-mail"] == "read and understood (mailtos://…)"
    assert secret not in out + err and "pw@" not in out + err
