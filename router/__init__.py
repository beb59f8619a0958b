"""kvemu router package."""
