// Validate one glTF/GLB file with the Khronos validator; print its report as JSON.
// usage: node validate.js FILE
const fs = require("fs");
const path = require("path");
const validator = require("gltf-validator");

const file = process.argv[2];
const data = new Uint8Array(fs.readFileSync(file));
validator
  .validateBytes(data, {
    uri: path.basename(file),
    maxIssues: 100,
    externalResourceFunction: (uri) =>
      new Promise((resolve, reject) => {
        fs.readFile(path.resolve(path.dirname(file), decodeURIComponent(uri)), (err, d) =>
          err ? reject(err.toString()) : resolve(new Uint8Array(d)));
      }),
  })
  .then((report) => process.stdout.write(JSON.stringify(report)))
  .catch((err) => { process.stderr.write(String(err)); process.exit(1); });
