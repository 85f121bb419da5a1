-- A second intent, for the relay's plain path (201 on the first POST). Same order, another event
-- and queue, so the worker demo on guide-jobs sees only the guide's event.
BEGIN;
INSERT INTO guide_app.outbox (event_id, job) VALUES (
    '018f0000-0000-7000-8000-000000000043',
    '{"id":"018f0000-0000-7000-8000-000000000043","type":"order.audit","args":[{"version":1,"order_id":42}],"queue":"guide-audit"}'
);
COMMIT;
