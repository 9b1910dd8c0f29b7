"""OpInfo entries for the 'sources' op group."""

from tests.opinfo import OpInfo

OP_INFOS: list[OpInfo] = []
