"""The web page's guards without a browser: who a cookie names, what a forged or old one
gets, the slowed logins, the proxy's header, and a web: section that would expose the page."""

from __future__ import annotations

import asyncio
import io
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest
from argon2 import PasswordHasher, Type
from pydantic import ValidationError

from upsguard.cli import main
from upsguard.config.web import WebConfig
from upsguard.controller.web.auth import (
    MIN_PASSWORD,
    NAME_MAX_DELAY_S,
    SECRET_HEADER,
    Keys,
    LoginThrottle,
    PasswordCheck,
    Proxy,
    Sessions,
    csrf_ok,
    hash_password,
    trusted_proxy,
)
from upsguard.errors import PermanentError

ANA_HASH = hash_password("op-secret")


def config(**extra: Any) -> WebConfig:
    users = [
        {"name": "ana", "role": "operator", "password_hash": ANA_HASH},
        {"name": "noc", "role": "viewer", "password_hash": ANA_HASH},
    ]
    return WebConfig.model_validate({"users": users, **extra})


def test_a_session_names_its_user_with_the_role_the_site_file_gives_now() -> None:
    sessions = Sessions(config(), Keys(b"k" * 32))
    cookie = sessions.issue("ana", now=1000.0)
    user = sessions.user(cookie, now=1001.0)
    assert user is not None and (user.name, user.role, user.may_act) == ("ana", "operator", True)
    assert csrf_ok(user, user.csrf) and not csrf_ok(user, "") and not csrf_ok(user, "x" * 32)
    demoted = config(users=[{"name": "ana", "role": "viewer", "password_hash": ANA_HASH}])
    again = Sessions(demoted, Keys(b"k" * 32)).user(cookie, now=1001.0)
    assert again is not None and not again.may_act  # the role is the file's, not the cookie's
    gone = config(users=[{"name": "noc", "password_hash": ANA_HASH}])
    assert Sessions(gone, Keys(b"k" * 32)).user(cookie, now=1001.0) is None


@pytest.mark.parametrize(
    "forge",
    [
        lambda c: c[:-2] + ("AA" if not c.endswith("AA") else "BB"),  # signature changed
        lambda c: "eyJ1Ijoibm9jIn0" + c[c.index(".") :],  # payload changed
        lambda c: c.replace(".", ""),
        lambda c: "",
        lambda c: "a.b.c",
        lambda c: "%%%." + c.split(".")[1],
    ],
)
def test_a_forged_cookie_names_nobody(forge: Any) -> None:
    sessions = Sessions(config(), Keys(b"k" * 32))
    cookie = sessions.issue("ana")
    assert sessions.user(forge(cookie)) is None


def test_a_cookie_of_another_key_or_past_its_lifetime_names_nobody() -> None:
    cfg = config(session_lifetime="1h")
    cookie = Sessions(cfg, Keys(b"k" * 32)).issue("ana", now=0.0)
    assert Sessions(cfg, Keys(b"other" * 8)).user(cookie, now=1.0) is None  # a restart
    assert Sessions(cfg, Keys(b"k" * 32)).user(cookie, now=3601.0) is None


@dataclass
class FakeClock:
    now: float = 0.0

    def __call__(self) -> float:
        return self.now


def test_failed_logins_wait_longer_each_time_and_a_success_forgets_them() -> None:
    clock = FakeClock()
    throttle = LoginThrottle(clock)
    delays = []
    for _ in range(5):
        assert throttle.admit("ana", "10.0.0.9") == 0.0
        delays.append(throttle.record("ana", "10.0.0.9", ok=False))
        clock.now += 100.0
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0]
    clock.now -= 99.0  # one second after the fifth failure
    assert throttle.admit("ana", "10.0.0.9") == 7.0
    assert throttle.admit("noc", "10.0.0.9") == 7.0  # the same address, whatever the name
    assert throttle.admit("ana", "10.0.0.7") == 0.0  # an address with no failures
    throttle.record("ana", "10.0.0.7", ok=True)
    for _ in range(20):
        throttle.record("ana", "10.0.0.9", ok=False)
    assert throttle.admit("ana", "10.0.0.9") == 60.0  # capped
    throttle.record("ana", "10.0.0.9", ok=True)
    assert throttle.admit("ana", "10.0.0.9") == 0.0


def test_an_attempt_is_reserved_before_its_check_so_parallel_ones_wait() -> None:
    throttle = LoginThrottle(FakeClock())
    assert throttle.admit("ana", "10.0.0.9") == 0.0
    assert throttle.admit("ana", "10.0.0.9") > 0  # the first is being checked
    assert throttle.admit("noc", "10.0.0.9") > 0
    assert throttle.admit("ana", "10.0.0.8") == 0.0  # another address is not held up
    throttle.record("ana", "10.0.0.9", ok=True)
    assert throttle.admit("ana", "10.0.0.9") == 0.0


def test_a_name_guessed_from_many_addresses_slows_those_addresses_never_a_clean_one() -> None:
    clock = FakeClock()
    throttle = LoginThrottle(clock)
    for i in range(30):  # one guess each from 30 addresses
        assert throttle.admit("ana", f"192.0.2.{i}") == 0.0
        throttle.record("ana", f"192.0.2.{i}", ok=False)
    clock.now += 1.0  # every address's own wait is over
    assert throttle.admit("ana", "192.0.2.1") == NAME_MAX_DELAY_S  # the name's wait, capped
    assert throttle.admit("noc", "192.0.2.2") == 0.0  # another name: the address's wait only
    throttle.record("noc", "192.0.2.2", ok=False)
    assert throttle.admit("ana", "10.0.0.7") == 0.0  # ana herself, from a clean address


def test_passwords_are_checked_against_their_hash_and_a_wrong_name_is_no_shortcut() -> None:
    check = PasswordCheck(config())

    async def tries() -> list[bool]:
        return [
            await check.verify("ana", "op-secret"),
            await check.verify("ana", "op-secreT"),
            await check.verify("mallory", "op-secret"),
        ]

    assert asyncio.run(tries()) == [True, False, False]
    assert "op-secret" not in ANA_HASH and ANA_HASH.startswith("$argon2id$")


def test_the_proxy_header_is_trusted_only_from_the_proxy_with_its_secret(tmp_path: Path) -> None:
    secret = tmp_path / "proxy.secret"
    secret.write_text("s" * 16 + "\n")
    secret.chmod(0o600)
    cfg = config(proxy={"trusted": ["127.0.0.1/32", "fd00::/8"], "secret_file": str(secret)})
    assert trusted_proxy(cfg, "127.0.0.1") and trusted_proxy(cfg, "fd00::5")
    assert not trusted_proxy(cfg, "127.0.0.2") and not trusted_proxy(cfg, None)
    assert not trusted_proxy(config(), "127.0.0.1")  # no proxy configured
    proxy = Proxy.for_config(cfg)
    named = {"X-Remote-User": "noc", SECRET_HEADER: "s" * 16}
    assert proxy.user_name("127.0.0.1", named) == "noc"
    assert proxy.user_name("127.0.0.2", named) is None  # not its address
    assert proxy.user_name("127.0.0.1", {**named, SECRET_HEADER: "s" * 15}) is None
    assert proxy.user_name("127.0.0.1", {**named, SECRET_HEADER: "é" * 16}) is None
    assert Proxy.for_config(config()).user_name("127.0.0.1", named) is None
    user = Sessions(cfg, Keys(b"k" * 32)).proxied("noc")
    assert user is not None and user.role == "viewer" and user.via_proxy
    assert Sessions(cfg, Keys(b"k" * 32)).proxied("mallory") is None
    secret.write_text("short\n")
    with pytest.raises(PermanentError, match=f"web.proxy.secret_file {secret}: the secret is "):
        Proxy.for_config(cfg)


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        ({"listen": "0.0.0.0"}, "not loopback: give tls"),
        ({"users": []}, "at least 1 item"),
        ({"users": [{"name": "ana"}]}, "has no password_hash"),
        ({"users": [{"name": "ana", "password_hash": "plain-text"}]}, "is not an argon2id hash"),
        (
            {"users": [{"name": "a", "password_hash": ANA_HASH}] * 2},
            "user 'a' is named twice",
        ),
    ],
)
def test_a_web_section_that_would_expose_the_page_is_refused(
    extra: dict[str, Any], says: str, tmp_path: Path
) -> None:
    with pytest.raises(ValidationError, match=says):
        config(**extra)


def test_any_address_with_tls_and_proxy_only_users_with_a_proxy_are_accepted(
    tmp_path: Path,
) -> None:
    tls = {"certificate_file": str(tmp_path / "c.pem"), "key_file": str(tmp_path / "k.pem")}
    cfg = config(listen="0.0.0.0", tls=tls)
    assert cfg.cookies_secure
    proxy = {"trusted": ["127.0.0.1"], "secret_file": str(tmp_path / "proxy.secret")}
    proxied = config(users=[{"name": "ana"}], proxy=proxy)
    assert not proxied.cookies_secure and proxied.user("ana") is not None


class RecordingHasher(PasswordHasher):
    """argon2's hasher, noting the thread of every hash and check it makes."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: list[int] = []

    def hash(self, password: str | bytes, *, salt: bytes | None = None) -> str:
        self.threads.append(threading.get_ident())
        return super().hash(password, salt=salt)

    def verify(self, hash: str | bytes, password: str | bytes) -> Literal[True]:
        self.threads.append(threading.get_ident())
        return super().verify(hash, password)


def test_no_password_work_is_done_on_the_event_loop_not_even_for_an_unknown_name() -> None:
    hasher = RecordingHasher()

    async def tries() -> list[bool]:
        check = PasswordCheck(config(), hasher)
        await check.start()
        return [await check.verify("mallory", "op-secret"), await check.verify("ana", "x")]

    async def on_the_loop() -> int:
        return threading.get_ident()

    loop = asyncio.new_event_loop()
    try:
        loop_thread = loop.run_until_complete(on_the_loop())
        assert loop.run_until_complete(tries()) == [False, False]
    finally:
        loop.close()
    assert len(hasher.threads) == 3  # the decoy made once, two checks
    assert loop_thread not in hasher.threads


def test_a_session_ends_with_a_changed_password() -> None:
    keys = Keys(b"k" * 32)
    cookie = Sessions(config(), keys).issue("ana", now=1000.0)
    changed = config(users=[{"name": "ana", "role": "operator", "password_hash": hash_password(
        "a new one")}])  # fmt: skip
    assert Sessions(changed, keys).user(cookie, now=1001.0) is None
    assert Sessions(config(), keys).user(cookie, now=1001.0) is not None


def test_a_revoked_session_names_nobody_until_it_would_have_expired() -> None:
    sessions = Sessions(config(session_lifetime="1h"), Keys(b"k" * 32))
    cookie, other = sessions.issue("ana", now=1000.0), sessions.issue("ana", now=2000.0)
    sessions.revoke(cookie, now=1001.0)
    assert sessions.user(cookie, now=1002.0) is None
    assert sessions.user(other, now=1002.0) is not None  # another login of the same user
    sessions.revoke("forged.cookie", now=1002.0)  # nothing to revoke
    assert sessions.revoked == 1
    sessions.revoke(other, now=4601.0)  # the first has expired: it is forgotten
    assert sessions.revoked == 1


# -- what the page accepts as passwords, hashes and keys ----------------------------------


@pytest.mark.parametrize("password", ["x", "eleven char", ""])
def test_web_password_refuses_a_short_password_in_one_line(
    password: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(password + "\n"))
    assert main(["web-password"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (
        f"upsguard: the password is {len(password)} characters: give {MIN_PASSWORD} at least "
        "(a few words make a good one)\n"
    )


def test_web_password_hashes_a_long_enough_one_with_argon2id(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("twelve chars\n"))
    assert main(["web-password", "--name", "ana", "--role", "operator"]) == 0
    out = capsys.readouterr().out
    assert out.startswith('- {name: ana, role: operator, password_hash: "$argon2id$')


@pytest.mark.parametrize("kind", ["argon2i", "argon2d"])
def test_a_hash_that_is_not_argon2id_is_refused(kind: str) -> None:
    weaker = PasswordHasher(type={"argon2i": Type.I, "argon2d": Type.D}[kind]).hash("x" * 12)
    assert weaker.startswith(f"${kind}$")
    users = [{"name": "ana", "role": "operator", "password_hash": weaker}]
    with pytest.raises(ValidationError, match=r"is not an argon2id hash: make one with 'upsguard "
                       r"web-password'"):  # fmt: skip
        config(users=users)


@pytest.mark.parametrize(
    ("mode", "key", "says"),
    [
        (0o640, b"k" * 32, "readable by others than its owner (mode 0640): chmod 600 {path}"),
        (0o604, b"k" * 32, "readable by others than its owner (mode 0604): chmod 600 {path}"),
        (0o600, b"k" * 15, "the secret is shorter than 16 bytes"),
    ],
)
def test_a_session_key_file_others_can_read_or_too_short_is_refused(
    tmp_path: Path, mode: int, key: bytes, says: str
) -> None:
    path = tmp_path / "session.key"
    path.write_bytes(key)
    path.chmod(mode)
    cfg = config(session_key_file=str(path))
    with pytest.raises(PermanentError) as refused:
        Keys.for_config(cfg)
    assert str(refused.value) == f"web.session_key_file {path}: " + says.format(path=path)
    path.write_bytes(b"k" * 32)
    path.chmod(0o600)
    assert Keys.for_config(cfg).valid(b"x", Keys(b"k" * 32).sign(b"x"))


class BlockingHasher(PasswordHasher):
    """argon2's hasher whose checks of ``held`` wait until ``let_go`` is set: a guess that
    is still being checked."""

    def __init__(self, held: str) -> None:
        super().__init__()
        self.held = held
        self.let_go = threading.Event()

    def verify(self, hash: str | bytes, password: str | bytes) -> Literal[True]:
        if password == self.held:
            self.let_go.wait(timeout=60)
        return super().verify(hash, password)


def test_a_login_from_a_clean_address_is_not_queued_behind_the_guesses_being_checked() -> None:
    """Wrong passwords from 20 addresses kept the one check at a time busy: an operator's
    right password from a clean address waited behind every admitted guess (16 to 31 s on a
    busy machine, bench/web.py). Addresses that have failed share their own lane."""
    hasher = BlockingHasher(held="a guess")

    async def tries() -> bool:
        check = PasswordCheck(config(), hasher)
        await check.start()
        guess = asyncio.create_task(check.verify("ana", "a guess", failed_before=True))
        await asyncio.sleep(0)  # the guess holds its lane
        try:
            return await asyncio.wait_for(check.verify("ana", "op-secret"), timeout=30)
        finally:
            hasher.let_go.set()
            assert await guess is False

    assert asyncio.run(tries()) is True


class OrderedHasher(BlockingHasher):
    """A ``BlockingHasher`` that notes the passwords in the order they are checked."""

    def __init__(self, held: str) -> None:
        super().__init__(held)
        self.order: list[str] = []

    def verify(self, hash: str | bytes, password: str | bytes) -> Literal[True]:
        self.order.append(str(password))
        return super().verify(hash, password)


def test_a_new_browser_on_another_network_is_not_queued_behind_a_burst_of_first_guesses() -> None:
    """20 addresses' first wrong passwords (all clean until checked) queued an operator's
    login from a new browser behind every one of them: 2.8 s at the worst in bench/web.py.
    The clean lane takes turns between networks (IPv4 /24, IPv6 /64): the operator's check
    comes right after the one under way."""
    hasher = OrderedHasher(held="guess-1")

    async def tries() -> bool:
        check = PasswordCheck(config(), hasher)
        await check.start()
        guesses = [
            asyncio.create_task(check.verify("ana", f"guess-{i}", address=f"192.0.2.{i}"))
            for i in range(1, 21)
        ]
        while not hasher.order:  # the first guess is being checked, the others wait
            await asyncio.sleep(0.01)
        operator = asyncio.create_task(check.verify("ana", "op-secret", address="198.51.100.7"))
        await asyncio.sleep(0)  # the operator's check waits in the lane too
        hasher.let_go.set()
        ok = await asyncio.wait_for(operator, timeout=30)
        assert not any(await asyncio.gather(*guesses))
        return ok

    assert asyncio.run(tries()) is True
    assert hasher.order[:2] == ["guess-1", "op-secret"]
    assert len(hasher.order) == 21
