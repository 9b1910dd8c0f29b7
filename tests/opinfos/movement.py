"""OpInfo entries for the 'movement' op group."""

from tests.opinfo import OpInfo

OP_INFOS: list[OpInfo] = []
