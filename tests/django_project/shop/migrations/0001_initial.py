from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True
    dependencies: list = []  # noqa: RUF012

    operations = [  # noqa: RUF012
        migrations.CreateModel(
            name="Order",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("amount", models.IntegerField()),
                ("charge_id", models.CharField(max_length=64, null=True)),
            ],
        ),
    ]
