"""The one exception type for mistakes in what a user gave.

:class:`UserInputError` marks a problem with the input (a missing folder, an
unknown subject, a corrupt file, a grid with no load), not a bug: the app
prints its message on one line and exits with status 2, without a traceback.
Library modules raise subclasses of it (``DatasetError``, ``CorruptFileError``,
``InvalidProblemError``, ``ConversionError``) so callers can catch either the
specific kind or every input problem at once.
"""

from __future__ import annotations


class UserInputError(ValueError):
    """Something the user supplied cannot be used; the message says what and how to fix it."""
