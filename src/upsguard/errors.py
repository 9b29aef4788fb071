"""The one exception tree of upsguard.

Every error upsguard raises on purpose derives from ``UpsguardError``; the CLI
turns any of them into one line on stderr and an exit code, never a traceback.
Plugins translate the errors of the SDK underneath at their boundary
(``raise PlatformError(...) from exc``) into the most specific class here::

    UpsguardError                 exit 1 unless a subclass says otherwise
    ├── ConfigError               the site or scenario file is wrong (exit 2)
    ├── TemporaryError            worth retrying after ``retry_after`` seconds
    │   ├── UpsUnreachable        the UPS (or upsd, or the SNMP agent) did not answer
    │   │   └── NoAnswer          a simulated UPS the scenario keeps silent (or that failed)
    │   ├── PlatformUnreachable   vCenter, a BMC, an SSH host did not answer
    │   ├── RequestTimedOut       one request to a platform got no answer in its allowance
    │   ├── StoreUnavailable      no endpoint of the coordination store (etcd) answered in
    │   │                         time, or the store has no quorum
    │   ├── RunBusy               a person asked for a run while another is in progress,
    │   │                         a startup while a shutdown is due, or asked during a
    │   │                         reload of the site file
    │   ├── ServiceStopping       the service is stopping: no run starts; its next start
    │   │                         resumes what it left
    │   └── ApiBusy               the local API is at one of its bounds; ask again shortly
    ├── PermanentError            retrying will not help
    │   ├── AuthenticationError   wrong user, password or key
    │   │   └── HostKeyUnknown    an SSH host not in known_hosts, or with another key
    │   ├── KeyFileUnreadable     an SSH private key file that is not there, or not readable
    │   ├── GracefulUnavailable   no graceful path (no VMware Tools, no agent)
    │   ├── PluginNotFound        the site file names a plugin nobody provides
    │   ├── StepFailed            a runbook step gave up after retries and fallback
    │   └── BadRequest            a request to the local API is wrong (its HTTP status)
    ├── StepTimeout               a step (or a wait) ran past its deadline
    ├── LeadershipLost            this controller of a pair no longer leads: a write fenced
    │                             by its token was refused, or its lease is gone
    ├── JournalInUse              another service holds the journal (its lock)
    └── ServiceNotRunning         the override CLI found no running service

Errors of a library underneath (the NUT protocol client's, the journal file's ``Corrupt``)
stay inside the module that owns it and are translated at its boundary.
"""

from __future__ import annotations


class UpsguardError(Exception):
    """Root of every error upsguard raises on purpose."""

    exit_code = 1


class ConfigError(UpsguardError):
    """The site or scenario file is wrong; the message lists every problem."""

    exit_code = 2

    def __init__(self, problems: list[str] | str) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("\n".join(self.problems))


class TemporaryError(UpsguardError):
    """Worth retrying: the thing may answer after ``retry_after`` seconds."""

    def __init__(self, message: str, retry_after: float = 5.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class UpsUnreachable(TemporaryError):
    """The UPS, upsd or SNMP agent did not answer, or answered garbage."""


class PlatformUnreachable(TemporaryError):
    """A platform endpoint (vCenter, BMC, SSH host) did not answer."""


class StoreUnavailable(TemporaryError):
    """No endpoint of the coordination store answered within its timeout, or the store
    answered that it has no quorum. Says nothing of who leads: the lease may still run."""


class PermanentError(UpsguardError):
    """Retrying will not help; a person has to change something."""


class AuthenticationError(PermanentError):
    """Credentials were refused. The message never contains the secret."""


class KeyFileUnreadable(PermanentError):
    """The SSH private key the site file names is not there, or this user may not read it:
    no connection was tried (asyncssh reads it first, and says so as a connect error)."""


class GracefulUnavailable(PermanentError):
    """The graceful path does not exist for this target (no Tools, no agent)."""


class PluginNotFound(PermanentError):
    """The site file names a plugin that no module or entry point provides."""


class StepFailed(PermanentError):
    """A runbook step gave up after its retries and fallback."""


class StepTimeout(UpsguardError):
    """A step or a wait ran past its deadline."""


class LeadershipLost(UpsguardError):
    """A write fenced by this controller's token was refused, or its lease is gone: another
    controller leads (or nobody does yet), and this one must not act. Retrying the same
    write cannot help; only a new campaign starts a new term. ``leader`` names the holder
    the store showed, if any."""

    def __init__(self, message: str, leader: str | None = None) -> None:
        super().__init__(message)
        self.leader = leader


class ServiceNotRunning(UpsguardError):
    """The override CLI found no service on the local API socket."""


class NoAnswer(UpsUnreachable):
    """A simulated UPS that does not answer (the scenario's lost contact, or a failed UPS)."""


class RequestTimedOut(TemporaryError):
    """The platform did not answer one request in time; the request may be repeated."""


class RunBusy(TemporaryError):
    """A manual run was asked for while another run is in progress (or the site file was
    being read again)."""


class ServiceStopping(TemporaryError):
    """The service is stopping: no run starts now; its next start resumes what it left."""


class ApiBusy(TemporaryError):
    """The local API is at one of its bounds; trying again shortly will do."""


class HostKeyUnknown(AuthenticationError):
    """The host is not in ``known_hosts``, or its key is not the one listed there."""


class BadRequest(PermanentError):
    """A request to the local API is wrong; ``status`` is the HTTP status that says how."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class JournalInUse(UpsguardError):
    """Another service holds the journal."""


def naming(subject: str, error: BaseException) -> str:
    """``subject: error``, so that the line says what failed; an error whose words start
    with the subject already keeps them as they are, never ``db: db: ...``."""
    prefix, text = f"{subject}: ", str(error)
    return text if text.startswith(prefix) else prefix + text
