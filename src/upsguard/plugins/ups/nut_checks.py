"""What ``upsguard doctor`` checks of a UPS on upsd, without acting on it.

On connections of its own, each closed at once: the connection and STARTTLS, the login in
the role the site file configures (``LOGIN``, and ``PRIMARY`` for a primary), the data
(``LIST VAR``: a stale driver fails), ``LIST CMD`` against the commands the plan sends, and
the user's rights. upsd checks a user's right to an instant command only after it found the
UPS offers the command, and only by running it; so rights are tried only where that changes
nothing: ``test.battery.stop`` while no test runs (upsguard sends it to end a battery test
anyway), and ``ups.delay.shutdown`` set to the value it already has.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence

from upsguard.config.ups import UpsConfig
from upsguard.errors import ConfigError, UpsguardError
from upsguard.findings import Area, Finding, Verdict, fail, ok, warn
from upsguard.models import UpsName
from upsguard.plugins.ups.nut_client import REFUSED, STALE, NutClient, NutRefused

#: An instant command that does nothing when no battery test runs.
HARMLESS_COMMAND = "test.battery.stop"
_TESTING = "in progress"  # ups.test.result while a test runs
_DELAY_VAR = "ups.delay.shutdown"
Connect = Callable[[], Awaitable[NutClient]]


class NutCheck:
    """The findings of one ``diagnose``, in the order a person fixes them."""

    def __init__(
        self, name: UpsName, config: UpsConfig, where: str, commands: Sequence[str]
    ) -> None:
        assert config.nut is not None
        self.config = config
        self.s = config.nut
        self.commands = list(dict.fromkeys(commands))
        self.subject = str(name)
        self.server = where
        self.where = f"{where} UPS '{self.s.ups}'"

    def unreachable(self, exc: UpsguardError) -> Finding:
        text = str(exc)
        if self.s.starttls and ("TLS" in text or "certificate" in text):
            return fail(Area.UPS, self.subject, "starttls", text, _tls_fix(text))
        if isinstance(exc, ConfigError):
            return fail(Area.UPS, self.subject, "login", text, "fix the file or variable it names")
        return fail(
            Area.UPS,
            self.subject,
            "login",
            text,
            "start upsd there (or fix host and port), and let this machine through its firewall",
        )

    async def run(self, client: NutClient, connect: Connect) -> list[Finding]:
        """The findings, on ``client`` (connected and logged in with the user) and, for the
        rights, on one more connection from ``connect``."""
        found: list[Finding] = []
        if self.s.starttls:
            ca = f"ca_file {self.s.ca_file}" if self.s.ca_file else "the system's CAs"
            found.append(
                ok(Area.UPS, self.subject, "starttls", f"TLS with upsd, verified against {ca}")
            )
        login = await self._login(client)
        found.append(login)
        variables = await self._data(client, found)
        supported = await self._commands(client, found)
        if login.verdict is not Verdict.FAIL and variables is not None and supported:
            await self._rights(variables, supported, found, connect)
        return found

    async def _login(self, client: NutClient) -> Finding:
        user = self.s.user
        if user is None:
            return ok(Area.UPS, self.subject, "login", f"{self.where}: read without a user")
        role = {"none": "a user (not a monitor)", "secondary": "a secondary monitor"}.get(
            self.s.monitor, "the primary monitor"
        )
        try:
            await client.login(self.s.ups, primary=self.s.monitor == "primary")
        except NutRefused as exc:
            needs = "upsmon primary" if self.s.monitor == "primary" else "upsmon secondary"
            return fail(
                Area.UPS,
                self.subject,
                "login",
                f"{self.where}: upsd refused user '{user}' as {role} ({exc.word})",
                f"check the password file or variable, and give '{user}' '{needs}' in upsd.users",
            )
        return ok(
            Area.UPS, self.subject, "login", f"{self.where}: user '{user}' logged in as {role}"
        )

    async def _data(self, client: NutClient, found: list[Finding]) -> dict[str, str] | None:
        try:
            variables = await client.list_vars(self.s.ups)
        except NutRefused as exc:
            if exc.word == "UNKNOWN-UPS":
                found.append(
                    fail(
                        Area.UPS,
                        self.subject,
                        "data",
                        f"{self.server} serves no UPS named '{self.s.ups}'",
                        "set nut.ups to a name 'upsc -l' lists on that server",
                    )
                )
                return None
            why = {
                "DATA-STALE": "its driver stopped updating the data (DATA-STALE)",
                "DRIVER-NOT-CONNECTED": "no driver serves it (DRIVER-NOT-CONNECTED)",
            }.get(exc.word, f"upsd answered {exc.word}")
            found.append(
                fail(
                    Area.UPS,
                    self.subject,
                    "data",
                    f"{self.where}: {why}",
                    "check the UPS's driver (upsdrvctl start, its cable) and upsd's log",
                )
            )
            return None
        status = variables.get("ups.status", "")
        if not status or "WAIT" in status.split():
            found.append(
                fail(
                    Area.UPS,
                    self.subject,
                    "data",
                    f"{self.where}: no status from the driver yet (ups.status '{status}')",
                    "check the UPS's driver and upsd's log",
                )
            )
            return None
        charge = variables.get("battery.charge", "?")
        runtime = variables.get("battery.runtime", "?")
        found.append(
            ok(
                Area.UPS,
                self.subject,
                "data",
                f"fresh (upsd serves it within its MAXAGE): {status}, charge {charge} %, "
                f"runtime {runtime} s",
            )
        )
        return variables

    async def _commands(self, client: NutClient, found: list[Finding]) -> list[str]:
        if not self.commands:
            return []
        try:
            supported = [
                item.split(" ", 1)[0] for item in await client.list_items("CMD", self.s.ups)
            ]
        except NutRefused as exc:
            supported = []
            if exc.word not in STALE and exc.word != "UNKNOWN-UPS":
                raise
        missing = tuple(c for c in self.commands if c not in supported)
        offers = ", ".join(supported) or "none"
        if missing:
            found.append(
                fail(
                    Area.UPS,
                    self.subject,
                    "commands",
                    f"the driver of '{self.s.ups}' lacks {', '.join(missing)} (it offers: "
                    f"{offers})",
                    "use a command the UPS offers ('upscmd -l'), or a driver that has it",
                    missing=missing,
                )
            )
        else:
            found.append(
                ok(Area.UPS, self.subject, "commands", f"offers {', '.join(self.commands)}")
            )
        return supported

    async def _rights(
        self,
        variables: Mapping[str, str],
        supported: list[str],
        found: list[Finding],
        connect: Connect,
    ) -> None:
        user = self.s.user
        if user is None:
            found.append(
                fail(
                    Area.UPS,
                    self.subject,
                    "rights",
                    f"no user: upsd takes no instant command ({', '.join(self.commands)}) "
                    "without one",
                    "give nut.user and password_file, a user with 'instcmds' in upsd.users",
                    missing=("user",),
                )
            )
            return
        client = await connect()
        try:
            missing, said, tried = await self._try_rights(client, variables, supported)
        finally:
            await client.close()
        wanted = ", ".join(self.commands)
        granted = ", ".join(dict.fromkeys([*self.commands, HARMLESS_COMMAND]))
        if missing:
            found.append(
                fail(
                    Area.UPS,
                    self.subject,
                    "rights",
                    f"upsd refused user '{user}': {'; '.join(said)}",
                    f"in upsd.users give '{user}' "
                    + " and ".join(_GRANT[m].format(commands=granted) for m in missing),
                    missing=tuple(missing),
                )
            )
        elif tried:
            found.append(ok(Area.UPS, self.subject, "rights", f"user '{user}': {'; '.join(said)}"))
        else:
            said.insert(
                0,
                f"instant commands not tried: upsd says whether '{user}' may send {wanted} only "
                f"by running it, and this UPS offers nothing harmless to try ({HARMLESS_COMMAND})",
            )
            found.append(
                warn(
                    Area.UPS,
                    self.subject,
                    "rights",
                    "; ".join(said),
                    f"make sure upsd.users gives '{user}' instcmds = {wanted} (or ALL)",
                )
            )

    async def _try_rights(
        self, client: NutClient, variables: Mapping[str, str], supported: list[str]
    ) -> tuple[list[str], list[str], bool]:
        """What the user was refused (``instcmds``, ``set``), what was found in words, and
        whether an instant command could be tried at all."""
        missing: list[str] = []
        said: list[str] = []
        tried = False
        testing = _TESTING in variables.get("ups.test.result", "").lower() or "CAL" in (
            variables.get("ups.status", "").split()
        )
        if HARMLESS_COMMAND in supported and not testing:
            tried = True
            try:
                await client.instcmd(self.s.ups, HARMLESS_COMMAND)
                said.append(f"may send instant commands ({HARMLESS_COMMAND} taken)")
            except NutRefused as exc:
                if exc.word not in REFUSED:
                    raise
                missing.append("instcmds")
                said.append(f"instant command {HARMLESS_COMMAND}: {exc.word}")
        delay = variables.get(_DELAY_VAR)
        if delay is not None and self.config.at_shutdown_end.command is not None:
            try:
                if _DELAY_VAR in await client.list_rw(self.s.ups):
                    await client.set_var(self.s.ups, _DELAY_VAR, delay)
                    said.append(f"may set {_DELAY_VAR} (set to its own value {delay})")
            except NutRefused as exc:
                if exc.word not in REFUSED:
                    said.append(f"{_DELAY_VAR}: {exc.word}")
                else:
                    missing.append("set")
                    said.append(f"SET {_DELAY_VAR}: {exc.word}")
        return missing, said, tried


_GRANT = {"instcmds": "instcmds = {commands} (or ALL)", "set": "actions = SET"}


def _tls_fix(text: str) -> str:
    if "STARTTLS" in text:
        return "give upsd a certificate (CERTFILE, or CERTPATH and CERTIDENT in upsd.conf)"
    return "set nut.ca_file to the CA that signed upsd's certificate (for its address)"
