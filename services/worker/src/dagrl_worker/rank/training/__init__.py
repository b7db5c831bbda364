"""Training engines: data-parallel policy and value models, their forward passes and updates."""
