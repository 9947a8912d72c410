from django.db import models


class Order(models.Model):
    amount = models.IntegerField()
    charge_id = models.CharField(max_length=64, null=True)
