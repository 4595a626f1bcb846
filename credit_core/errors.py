"""The one exception type of credit_core."""

from __future__ import annotations


class CreditError(ValueError):
    """Bad input to a credit-assignment API: wrong shape, dtype, value, name or plugin.

    Messages always name the offending field, tensor, strategy or plugin and say what
    was expected.
    """
