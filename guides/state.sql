-- What the application tables hold, as one JSON line.
SELECT json_build_object(
    'order_paid', o.paid,
    'fulfillment_count', o.fulfillment_count,
    'outbox_rows', (SELECT count(*) FROM guide_app.outbox),
    'outbox_unsent', (SELECT coalesce(json_agg(event_id ORDER BY created_at, event_id), '[]')
                      FROM guide_app.outbox WHERE published_at IS NULL),
    'receipts', (SELECT count(*) FROM guide_app.receipts)
)
FROM guide_app.orders AS o WHERE o.id = 42;
