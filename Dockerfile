# checkpoint-exporter: a slim image running as an unprivileged user.
#   docker build -t checkpoint-exporter .
#   docker run --net=host --pid=host -v /:/host:ro,rslave -v /etc/checkpoint-exporter:/etc/checkpoint-exporter:ro \
#     checkpoint-exporter serve --config.file=/etc/checkpoint-exporter/config.yaml --path.procfs=/host/proc --path.sysfs=/host/sys
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY exporter ./exporter
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
RUN useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin exporter
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
USER 10001:10001
EXPOSE 25780
HEALTHCHECK --interval=30s --timeout=3s CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:25780/healthz', timeout=2)"
ENTRYPOINT ["checkpoint-exporter"]
CMD ["serve", "--config.file=/etc/checkpoint-exporter/config.yaml"]
