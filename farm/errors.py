"""One base error for every user-facing failure, and the exit codes the CLI returns.

A wrong kernel is data (a verdict), never an exception; these are for bad input,
unreachable services and broken stores, each with a message that names what is wrong.
"""

EXIT_OK = 0
EXIT_FAILED = 1  # the command ran, but some op/candidate failed
EXIT_USAGE = 2  # a user mistake: bad option, config, task file
EXIT_STORAGE = 3  # the store could not be read or written
EXIT_TIMEOUT = 4  # a wait ran out of time: the work goes on (farm submit --wait --timeout)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread as Ctrl-C is, so it unwinds the same way (farm.cli.main)."""


class FarmError(Exception):
    """A failure the user can act on; the CLI prints it without a traceback."""

    exit_code = EXIT_USAGE


class ConfigError(FarmError):
    """A configuration key is unknown or has the wrong type."""


class TaskError(FarmError):
    """A task file breaks a rule of the task format."""

    def __init__(self, path, rule: str, detail: str = ""):
        self.path = str(path)
        self.rule = rule
        self.detail = detail
        msg = f"{self.path}: {rule}"
        super().__init__(f"{msg}: {detail}" if detail else msg)


class StorageError(FarmError):
    """The store is unreachable, an object is missing or fails its checksum.

    `transient` marks failures of the moment (a full disk, a lost connection, a timeout):
    work that met one is retried on the next run instead of being recorded as a lasting error."""

    exit_code = EXIT_STORAGE

    def __init__(self, message: str = "", transient: bool = False):
        super().__init__(message)
        self.transient = transient


class IntegrityError(StorageError):
    """An object's bytes do not match its recorded sha256."""


class InvalidName(FarmError):
    """A source or op name that could escape its storage prefix."""


class WaitTimeout(FarmError):
    """A wait gave up before the work finished; the work itself goes on."""

    exit_code = EXIT_TIMEOUT
