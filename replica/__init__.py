"""kvemu replica package."""
