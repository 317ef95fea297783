"""The worker: reads task messages from Redis Streams, claims, executes and reports them."""
