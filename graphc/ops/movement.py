"""Ops of the 'movement' group (being written)."""

TENSOR_METHODS: dict = {}
PUBLIC: tuple = ()
