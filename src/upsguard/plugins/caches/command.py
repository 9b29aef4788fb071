"""Any other cache, driven by shell commands from the site file.

Each command runs with ``sh -c`` (here, or on ``ssh:``'s host); ``{target}`` in it is
replaced by the target's name, shell-quoted. ``read_mode`` prints a mode word
(``write-back``/``writeback``/``wb``, ``write-through``/``writethrough``/``wt``, ...);
``read_dirty_bytes`` prints a byte count (``1048576``, or a size like ``512MiB``).
The cache is clean when dirty bytes are 0 and the mode is not write-back. A command
that exits non-zero is reported with its first line of output.
"""

from __future__ import annotations

import shlex

from upsguard.clock import Clock
from upsguard.config.caches import CommandCacheSettings
from upsguard.config.types import parse_bytes
from upsguard.errors import PermanentError, TemporaryError
from upsguard.findings import Finding
from upsguard.models import CacheMode, CacheName, CacheState, CacheTarget
from upsguard.plugins.caches.base import may_flip
from upsguard.plugins.remote import Runner, program_of

TIMEOUT = 60.0
_SEPARATOR = "--upsguard-read-dirty-bytes--"
_MODE_WORDS = {
    "writeback": CacheMode.WRITE_BACK,
    "wb": CacheMode.WRITE_BACK,
    "awb": CacheMode.WRITE_BACK,
    "writethrough": CacheMode.WRITE_THROUGH,
    "wt": CacheMode.WRITE_THROUGH,
    "writearound": CacheMode.WRITE_AROUND,
    "wa": CacheMode.WRITE_AROUND,
    "cleaner": CacheMode.CLEANER,
    "none": CacheMode.NONE,
    "off": CacheMode.NONE,
}


def parse_mode(text: str) -> CacheMode:
    word = text.strip().split("\n")[0].strip().lower().replace("-", "").replace("_", "")
    return _MODE_WORDS.get(word, CacheMode.UNKNOWN)


class CommandCacheProvider:
    """One ``caches:`` entry of provider ``command``."""

    def __init__(self, settings: CommandCacheSettings, clock: Clock) -> None:
        self.name: CacheName = settings.name
        self._settings = settings
        self._clock = clock
        self._runner = Runner(settings.ssh, pass_env=settings.pass_env)

    async def targets(self) -> list[CacheTarget]:
        names = self._settings.targets or [str(self.name)]
        return [CacheTarget(self.name, name) for name in names]

    async def read(self, target: CacheTarget) -> CacheState:
        mode_text, dirty_text = await self._read_both(target)
        mode = parse_mode(mode_text)
        try:
            dirty = parse_bytes(dirty_text.strip().split("\n")[0].strip())
        except ValueError as exc:
            raise TemporaryError(
                f"cache '{self.name}' {target.name}: read_dirty_bytes printed "
                f"{dirty_text.strip()[:40]!r}, not a byte count"
            ) from exc
        clean = dirty == 0 and mode.holds_no_new_writes
        detail = "" if mode is not CacheMode.UNKNOWN else f"read_mode printed {mode_text[:40]!r}"
        return CacheState(target, self._clock.now(), mode, dirty, clean, detail)

    async def set_mode(self, target: CacheTarget, mode: CacheMode) -> None:
        if mode is CacheMode.WRITE_THROUGH:
            await self._sh("set_write_through", self._settings.set_write_through, target)
        elif mode is CacheMode.WRITE_BACK:
            await self._sh("set_write_back", self._settings.set_write_back, target)
        else:
            raise PermanentError(f"cache '{self.name}': no command for mode '{mode}'")

    async def flush(self, target: CacheTarget) -> None:
        if self._settings.flush:
            await self._sh("flush", self._settings.flush, target)

    async def diagnose(self, targets: list[CacheTarget]) -> list[Finding]:
        """``CacheDiagnosis``: the programs its command lines start are there."""
        st = self._settings
        lines = [st.read_mode, st.read_dirty_bytes, st.set_write_through, st.set_write_back]
        programs = sorted({p for p in map(program_of, [*lines, st.flush or ""]) if p})
        return [await may_flip(self.name, self._runner, programs=programs)]

    async def close(self) -> None:
        await self._runner.close()

    async def _read_both(self, target: CacheTarget) -> tuple[str, str]:
        """``read_mode`` and ``read_dirty_bytes`` in one shell: half the processes per poll."""
        name = shlex.quote(target.name)
        mode = self._settings.read_mode.replace("{target}", name)
        dirty = self._settings.read_dirty_bytes.replace("{target}", name)
        script = f"{{ {mode}\n}} || exit $?\necho {_SEPARATOR}\n{{ {dirty}\n}}"
        result = await self._runner.run(["sh", "-c", script], timeout=TIMEOUT)
        mode_text, separated, dirty_text = result.stdout.partition(f"{_SEPARATOR}\n")
        if not result.ok:
            what = "read_dirty_bytes" if separated else "read_mode"
            raise PermanentError(
                f"cache '{self.name}' {target.name}: {what} failed "
                f"(exit status {result.exit_status}): {result.first_error_line()}"
            )
        return mode_text, dirty_text

    async def _sh(self, what: str, command: str, target: CacheTarget) -> str:
        script = command.replace("{target}", shlex.quote(target.name))
        result = await self._runner.run(["sh", "-c", script], timeout=TIMEOUT)
        if not result.ok:
            raise PermanentError(
                f"cache '{self.name}' {target.name}: {what} failed "
                f"(exit status {result.exit_status}): {result.first_error_line()}"
            )
        return result.stdout
