"""The one base class for mistakes a user can fix: the CLI prints them as one line."""


class HarnessError(Exception):
    """A user-facing error; str() is one line naming the file/field/value at fault."""
