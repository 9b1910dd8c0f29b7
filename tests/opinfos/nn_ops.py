"""OpInfo entries for the 'nn_ops' op group."""

from tests.opinfo import OpInfo

OP_INFOS: list[OpInfo] = []
