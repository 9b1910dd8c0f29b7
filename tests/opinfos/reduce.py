"""OpInfo entries for the 'reduce' op group."""

from tests.opinfo import OpInfo

OP_INFOS: list[OpInfo] = []
