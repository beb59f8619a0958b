"""SGLang's rooms on a prefill replica (replica/sglang_pd.py): a room whose hold no decoder claimed within its
time to live takes the hold with it; a claimed room, or one never held, releases nothing."""

import asyncio

from replica.sglang_pd import Rooms


def test_an_unclaimed_room_releases_its_hold_and_a_claimed_one_does_not():
    released: list[str] = []

    async def scenario() -> dict | None:
        rooms = Rooms(ttl_s=0.05, on_unclaimed=released.append)
        rooms.bind(1, {"remote_request_id": "pd-a"})  # held, never asked for
        rooms.bind(2, {"remote_request_id": "pd-b"})
        claimed = await rooms.claim(2, 1.0)
        asked = asyncio.ensure_future(rooms.claim(3, 0.2))  # asked for, never held
        await asyncio.sleep(0.15)
        assert rooms.rooms == {} and await asked is None
        return claimed

    assert asyncio.run(scenario()) == {"remote_request_id": "pd-b"}
    assert released == ["pd-a"]
