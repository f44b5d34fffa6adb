"""The base of every error a user fixes by changing their input, config, paths or flags.

Each concern raises its own subclass (ConfigError, DataError, CheckpointError, ...) with a message that
names the file or field; the `bertdist` command prints any of them as `bertdist COMMAND: message` and
exits with status 2, without a traceback. Everything else is a bug and keeps its traceback.
"""


class UserError(Exception):
    """A problem with what the user gave us, explained in the message."""
