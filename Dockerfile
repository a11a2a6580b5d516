# One image for the router, the bridge, the relay and the engine simulator.
FROM node:20-bookworm-slim
WORKDIR /app
COPY package.json package-lock.json ./
RUN npm ci --no-audit --no-fund
COPY . .
RUN npm run build:njs
EXPOSE 9002 9100 8000 5557
CMD ["node", "--import", "tsx", "extproc/main.ts", "--help"]
