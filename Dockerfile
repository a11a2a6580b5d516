# One image for the router, the bridge, the relay, registration and the
# engine simulator:  infera-gate [router|bridge|relay|register|sim] [flags]
# Flags may also come from INFERA_* env vars or a --config file (docs/configuration.md).

# Build stage: dev dependencies, compile TypeScript to dist/, build the njs bundle.
FROM node:20-bookworm-slim AS build
WORKDIR /app
COPY package.json package-lock.json ./
RUN npm ci --no-audit --no-fund --ignore-scripts
COPY . .
RUN node scripts/build-dist.js && npm run build:njs

# Runtime stage: production dependencies and compiled JavaScript only.
FROM node:20-bookworm-slim AS runtime
ENV NODE_ENV=production
WORKDIR /app
COPY package.json package-lock.json ./
RUN npm ci --omit=dev --no-audit --no-fund --ignore-scripts && npm cache clean --force
COPY --from=build /app/dist ./dist
COPY --from=build /app/njs/dist ./njs/dist
COPY nginx ./nginx
COPY envoy ./envoy
# The router's ports stay on loopback unless --host (INFERA_HOST) opens them;
# in a container that is what you want for ext_proc beside Envoy in one pod.
USER node
EXPOSE 9002 9100
# Liveness of the router (or the bridge: set INFERA_ADMIN_PORT=9101).
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
  CMD ["node", "-e", "fetch('http://127.0.0.1:'+(process.env.INFERA_ADMIN_PORT||9100)+'/livez').then(r=>process.exit(r.ok?0:1),()=>process.exit(1))"]
ENTRYPOINT ["node", "dist/cli/main.js"]
# The router, its fleet from etcd (INFERA_ETCD_ENDPOINT) or INFERA_WORKERS.
CMD ["router"]
