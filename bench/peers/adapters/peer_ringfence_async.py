"""The producer of ringfence's ``async def`` handler (``peer_ringfence:async_app``)."""

import peer_ringfence


class Producer(peer_ringfence.Producer):
    app, task = peer_ringfence.async_app, peer_ringfence.ajob
