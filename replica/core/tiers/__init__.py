"""The KV memory hierarchy below HBM."""

import shared  # noqa: F401, E402 - installs the compiled modules' finder before the tier stack is imported
