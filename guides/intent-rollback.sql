-- The guide, section 1, with ROLLBACK instead of COMMIT: neither the change nor the intent remains.
BEGIN;
UPDATE guide_app.orders SET paid = true WHERE id = 42;
INSERT INTO guide_app.outbox (event_id, job) VALUES (
    '018f0000-0000-7000-8000-000000000042',
    '{"id":"018f0000-0000-7000-8000-000000000042","type":"order.fulfill","args":[{"version":1,"order_id":42}],"queue":"guide-jobs"}'
);
ROLLBACK;
