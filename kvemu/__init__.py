"""kvemu command line."""
