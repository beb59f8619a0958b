"""kvemu loadgen package."""

import shared  # noqa: F401 - installs the compiled modules' finder before loadgen.arrivals is imported
