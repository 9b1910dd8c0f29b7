"""OpInfo entries for the 'random' op group."""

from tests.opinfo import OpInfo

OP_INFOS: list[OpInfo] = []
