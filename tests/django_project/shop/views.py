"""An order and the message that closes it later: one transaction, both or neither."""

from django.db import transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from tidemq.contrib.django import send

from .models import Order


@csrf_exempt
@require_POST
def create_order(request: HttpRequest) -> JsonResponse:
    with transaction.atomic():
        order = Order.objects.create(item=request.POST["item"])
        message = send("order.close", {"order_id": order.pk}, delay=float(request.POST.get("delay", 0)))
        if request.POST.get("fail"):  # something after the enqueue fails: the whole transaction rolls back
            raise RuntimeError("payment refused")
    return JsonResponse({"order": order.pk, "message": message})


def order(request: HttpRequest, pk: int) -> JsonResponse:
    found = Order.objects.get(pk=pk)
    return JsonResponse({"order": found.pk, "status": found.status, "close_message": found.close_message})
