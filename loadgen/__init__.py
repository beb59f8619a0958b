"""kvemu loadgen package."""
