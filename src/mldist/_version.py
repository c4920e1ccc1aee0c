"""The version of mldist: a leaf module, so every stage can read it without importing the facade.

Example:
    >>> from mldist._version import __version__
    >>> __version__.count(".")
    2
"""

__version__ = "0.1.0"
