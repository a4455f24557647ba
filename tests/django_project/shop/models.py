from django.db import models


class Order(models.Model):
    item = models.CharField(max_length=100)
    status = models.CharField(max_length=20, default="open")
    close_message = models.BigIntegerField(null=True)
