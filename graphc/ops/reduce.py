"""Ops of the 'reduce' group (being written)."""

TENSOR_METHODS: dict = {}
PUBLIC: tuple = ()
