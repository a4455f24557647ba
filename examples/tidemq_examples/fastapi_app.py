"""A FastAPI app on ``tidemq.aio``: its lifespan opens the client once and closes it at shutdown.

    pip install 'tidemq[fastapi]'
    TIDEMQ_ZK_HOSTS=127.0.0.1:2181 uvicorn tidemq_examples.fastapi_app:app

Routes:

- ``POST /orders`` ``{"item": "a book"}``: schedules the order's close (``example.order.close``,
  handled by ``tidemq_examples.orders``) for when its payment window ends.
- ``POST /orders/{order_id}/paid?close_message=ID``: the order was paid in time, so its close is
  cancelled (``cancelled`` is false when it already ran or is running).
- ``POST /mails`` ``{"to": ..., "text": ...}``: queues a mail; ``POST /mails/send?limit=N`` sends
  queued mails in one batch (``tidemq.aio.BatchConsumer``: many pulled, many acked in one call),
  as a scheduler calling the app every minute would.
- ``POST /quotes`` ``{"item": ..., "quantity": n}``: asks a worker to price an order
  (``example.quote``, handled by ``tidemq_examples.quotes``) and returns the message id;
  ``GET /quotes/{id}?wait=S`` awaits its result through a handle (``tidemq.aio.handle``): the
  price, 404 for an unknown id, 422 when the worker's handler failed (its error type and
  message), 202 while it is still running after ``wait`` seconds.

Every route takes the client through the ``TidemqClient`` dependency (``app.state.tidemq``), so
a further route is one function with that parameter. tidemq's input errors become 422 answers
that name the limit, a cluster out of reach 503.
"""

from __future__ import annotations

import logging
import uuid
from contextlib import asynccontextmanager
from typing import Annotated, AsyncIterator

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel

import tidemq.aio
from tidemq.aio import AsyncClient, BatchConsumer
from tidemq.errors import MessageNotFoundError, RemoteError, ResultTimeoutError, RetriableError, ValidationError

__all__ = ["app", "create_app", "PAYMENT_WINDOW"]

log = logging.getLogger(__name__)

#: Seconds an order may stay unpaid before it is closed.
PAYMENT_WINDOW = 30 * 60
MAIL_TOPIC = "example.mail"


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    # Made at start (TIDEMQ_* variables): an unreachable ZooKeeper fails the start, not a request.
    app.state.tidemq = tidemq.aio.client()
    app.state.mails = BatchConsumer(MAIL_TOPIC, ttr=30, client=app.state.tidemq)
    log.info("tidemq client open")
    try:
        yield
    finally:
        await tidemq.aio.close()  # in-flight produces finish first; then the channels close
        log.info("tidemq client closed")


def tidemq_client(request: Request) -> AsyncClient:
    """The app's client, opened by the lifespan."""
    return request.app.state.tidemq


TidemqClient = Annotated[AsyncClient, Depends(tidemq_client)]


class NewOrder(BaseModel):
    item: str


class Mail(BaseModel):
    to: str
    text: str = ""


class QuoteRequest(BaseModel):
    item: str
    quantity: int = 1


def create_app() -> FastAPI:
    """The application, with its routes and tidemq's errors mapped to HTTP answers."""
    app = FastAPI(title="tidemq example shop", lifespan=lifespan)

    @app.exception_handler(ValidationError)
    async def refused(request: Request, exc: ValidationError) -> JSONResponse:
        return JSONResponse({"error": type(exc).__name__, "detail": str(exc)}, status_code=422)

    @app.exception_handler(RetriableError)
    async def unavailable(request: Request, exc: RetriableError) -> JSONResponse:
        return JSONResponse({"error": type(exc).__name__, "detail": str(exc)}, status_code=503,
                            headers={"Retry-After": "1"})

    @app.post("/orders")
    async def place_order(order: NewOrder, client: TidemqClient) -> dict:
        order_id = uuid.uuid4().hex
        message_id = await client.produce("example.order.close", {"order_id": order_id, "item": order.item},
                                          delay=PAYMENT_WINDOW, unique_key=f"order-close-{order_id}")
        return {"order_id": order_id, "close_message": message_id}

    @app.post("/orders/{order_id}/paid")
    async def paid(order_id: str, close_message: int, client: TidemqClient) -> dict:
        return {"order_id": order_id, "cancelled": await client.cancel(close_message)}

    @app.post("/mails")
    async def queue_mail(mail: Mail, client: TidemqClient) -> dict:
        return {"message": await client.produce(MAIL_TOPIC, mail.model_dump(), retry=3)}

    @app.post("/mails/send")
    async def send_mails(request: Request, limit: int = 100) -> dict:
        consumer: BatchConsumer = request.app.state.mails
        batch = await consumer.pull(max_messages=limit, wait=0.5)
        sent, failed = [], {}
        for message in batch:
            with consumer.processing(message):  # spans made here join the mail's trace
                if "@" in message.data.get("to", ""):
                    sent.append(message.id)  # a real app hands it to its mail server here
                else:
                    failed[message.id] = f"not an address: {message.data.get('to')!r}"
        result = await consumer.ack(succeeded=sent, failed=failed)
        return {"sent": sent, "failed": sorted(failed), "stale": result.stale}

    @app.post("/quotes")
    async def ask_quote(request: QuoteRequest, client: TidemqClient) -> dict:
        # No retry: a price that cannot be computed now will not be computable in a minute.
        handle = await client.produce("example.quote", request.model_dump(), retry=0, result=True)
        return {"quote": handle.id}

    @app.get("/quotes/{quote_id}")
    async def get_quote(quote_id: int, client: TidemqClient, wait: float = 5.0) -> JSONResponse:
        # The broker long-polls for the result, woken by the worker's ack: no polling loop here.
        try:
            price = await client.handle(quote_id).result(timeout=min(max(wait, 0.0), 30.0))
        except ResultTimeoutError:
            return JSONResponse({"quote": quote_id, "status": "pending"}, status_code=202)
        except MessageNotFoundError as exc:
            return JSONResponse({"error": type(exc).__name__, "detail": str(exc)}, status_code=404)
        except RemoteError as exc:  # the handler raised: its error is the answer
            return JSONResponse({"error": exc.type, "detail": exc.message}, status_code=422)
        return JSONResponse({"quote": quote_id, "price": price})

    return app


app = create_app()
