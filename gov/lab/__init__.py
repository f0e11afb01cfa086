"""Tools built on the product, never imported by it: ``simulate`` (`gov simulate`),
``bench`` (`gov bench`) and ``soak`` (`gov soak`)."""
