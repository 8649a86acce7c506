"""One base class for every error meant for the user: the CLI prints it as one line."""


class LocalspecError(Exception):
    """An error with a message a user can act on (no traceback shown)."""
