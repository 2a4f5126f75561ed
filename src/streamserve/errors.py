"""The exception classes where users catch them: ``streamserve.errors.OverloadedError`` and the rest.

They are defined in ``streamserve.wire.errors``, at the bottom layer, which imports nothing above it; this module is
their documented path.
"""

from streamserve.wire.errors import *  # noqa: F403
from streamserve.wire.errors import __all__ as __all__
