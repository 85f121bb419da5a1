-- The guide, section 3: the demo's deduplicated SQL effect. The receipt and the effect commit
-- together; a second delivery finds the receipt and updates nothing ("UPDATE 0").
BEGIN;
WITH first_delivery AS (
    INSERT INTO guide_app.receipts (event_id, order_id)
    VALUES ('018f0000-0000-7000-8000-000000000042', 42)
    ON CONFLICT (event_id) DO NOTHING
    RETURNING order_id
)
UPDATE guide_app.orders AS o
SET fulfillment_count = fulfillment_count + 1
FROM first_delivery AS d WHERE o.id = d.order_id;
COMMIT;
