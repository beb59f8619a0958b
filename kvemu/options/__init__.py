"""The command-line options the kvemu commands share: each choice, its default, flag and help defined once."""
