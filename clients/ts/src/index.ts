/** The package's entry ("@coordd/client"): the gRPC client (client.ts) and
 * the drop-in fetch (fetch.ts), which uses the client's types. Each
 * module imports only what it needs, and neither re-exports the other, so
 * the two form no circle; this module is where they meet. */
export * from "./client.js";
export { createFetch, NotCarriedError, PRIORITY_HEADER, type FetchFunction, type FetchOptions } from "./fetch.js";
