-- An intent whose event ID collides with a job someone else already stored with another envelope
-- (run.sh stores it first: type order.refund, order 7). The relay must stop, not mark it published.
BEGIN;
INSERT INTO guide_app.outbox (event_id, job) VALUES (
    '018f0000-0000-7000-8000-000000000044',
    '{"id":"018f0000-0000-7000-8000-000000000044","type":"order.audit","args":[{"version":1,"order_id":42}],"queue":"guide-audit"}'
);
COMMIT;
