"""The one exception type for misuse: what was wrong and what would be valid."""


class ConfigurationError(ValueError, TypeError):
    """Raised when an argument, a hook's return value or an object handed to the framework is unusable.

    It is both a ``ValueError`` and a ``TypeError`` so code that guards for the built-in a user would
    naturally expect keeps working; the message always names the argument and lists what is valid.
    """
