"""OpInfo entries for the 'pool' op group."""

from tests.opinfo import OpInfo

OP_INFOS: list[OpInfo] = []
