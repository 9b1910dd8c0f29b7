"""OpInfo entries for the 'conv' op group."""

from tests.opinfo import OpInfo

OP_INFOS: list[OpInfo] = []
